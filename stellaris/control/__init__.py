"""The control plane: drives a training job through the gateway API and the cache (never imports functions/)."""
