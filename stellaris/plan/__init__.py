"""`stellaris plan`: a scale model of the many-learner regime (docs/scale-model.md).

N learners whose gradients are computed for real, on real trajectories, against the policy version a learner of an
N-learner cluster would hold; their arrival times come from a latency model on a virtual clock. The pure parts (the
latency model, the event core, the cost and the report) import neither torch nor the functions; `simulate` runs the
functions' own code in this one process, as the offline evaluator does (docs/architecture.md).
"""
