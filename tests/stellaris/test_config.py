"""TrainConfig: what it asks the functions side for, and bad values named."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.jobspec import JobRequest, Plan, resolve
from functions.algos.stellaris import aggregation_rule
from stellaris import config
from stellaris.config import ConfigError, TrainConfig, load_config


def test_actor_policy_refresh_reaches_the_job_spec() -> None:
    cfg = TrainConfig(env="Hopper-v5", preset="fast", rounds=1, actor_run_ahead=1)
    assert cfg.actor_policy_refresh == 4
    spec = resolve(JobRequest.model_validate(cfg.job_request("j1")))
    assert spec.policy_refresh_steps == 4 and spec.num_envs == 2 and spec.actor_steps == 1024
    off = TrainConfig(env="Hopper-v5", preset="fast", rounds=1, actor_run_ahead=1, actor_policy_refresh=0)
    assert resolve(JobRequest.model_validate(off.job_request("j2"))).policy_refresh_steps == 0
    # At run-ahead 0 (the default) a batch is collected between rounds, when no version can land: looking would be a
    # wasted round trip.
    fresh = TrainConfig(env="Hopper-v5", preset="fast", rounds=1)
    assert fresh.actor_run_ahead == 0
    assert resolve(JobRequest.model_validate(fresh.job_request("j3"))).policy_refresh_steps == 0


def test_a_negative_refresh_is_named(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("env: Hopper-v5\nactor_policy_refresh: -1\nrounds: 1\n")
    with pytest.raises(ConfigError, match="actor_policy_refresh"):
        load_config(path, {})


@pytest.mark.parametrize(("cores", "learners"), [(1, 1), (2, 1), (3, 2), (64, 2)])
def test_the_default_learner_count_leaves_one_core_to_the_rest_and_stops_at_2(
    monkeypatch: pytest.MonkeyPatch, cores: int, learners: int
) -> None:
    monkeypatch.setattr(config.os, "sched_getaffinity", lambda _pid: set(range(cores)))
    assert TrainConfig(env="Hopper-v5", rounds=1).learners == learners
    assert TrainConfig(env="Hopper-v5", rounds=1, learners=4).learners == 4  # a count given wins


def test_a_run_resumed_on_a_bigger_machine_keeps_its_learner_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """config.yaml holds the config as dumped (the number, not "the machine's default"), and a resume reads it back."""
    monkeypatch.setattr(config.os, "sched_getaffinity", lambda _pid: {0, 1})
    written = TrainConfig(env="Hopper-v5", rounds=1).model_dump(mode="json")
    monkeypatch.setattr(config.os, "sched_getaffinity", lambda _pid: set(range(64)))
    assert TrainConfig.model_validate(written).learners == 1


# -- the knobs: declared once, and which value wins ------------------------------------------------------------------


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text("env: CartPole-v1\nrounds: 1\n" + text)
    return path


def _train_flags(monkeypatch: pytest.MonkeyPatch, *args: str) -> TrainConfig:
    """The TrainConfig `stellaris train ARGS` would run (the run itself replaced by a recorder)."""
    from typer.testing import CliRunner

    import stellaris.run
    from stellaris.cli import app

    seen: list[TrainConfig] = []
    monkeypatch.setattr(stellaris.run, "run_training", lambda cfg, resume=False: seen.append(cfg) or 0)
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output
    return seen[0]


def test_each_knob_is_declared_once_and_both_configs_take_it_from_there() -> None:
    from contract.algo_config import StellarisConfig
    from contract.knobs import KNOB_NAMES, knob_info, train_name

    for knob in KNOB_NAMES:
        declared = knob_info(knob)
        field = TrainConfig.model_fields[train_name(knob)]
        assert (field.default, field.metadata, field.description) == (
            declared.default,
            declared.metadata,
            declared.description,
        )
        assert getattr(StellarisConfig(), knob) == declared.default  # the functions' side agrees on the default


def test_a_yaml_knob_may_be_spelled_as_the_job_specs_override_and_reaches_the_job(tmp_path: Path) -> None:
    cfg = load_config(_yaml(tmp_path, "overrides: {lr: 0.001, stellaris: {d: 0.5, rule: sync, beta_floor: 3.0}}\n"), {})
    assert (cfg.d, cfg.mode) == (0.5, "sync")
    assert cfg.overrides == {"lr": 0.001, "stellaris": {"beta_floor": 3.0}}
    stellaris = resolve(JobRequest.model_validate(cfg.job_request("j1"))).algo.stellaris
    assert (stellaris.d, stellaris.rule, stellaris.beta_floor) == (0.5, "sync", 3.0)


def test_the_floor_defaults_to_one_above_the_tasks_in_flight_and_a_set_floor_wins(tmp_path: Path) -> None:
    # with T tasks in flight the gradient that ends a round is about T + 1 versions old: 3 learners claiming ahead
    # hold 6 (floor 7), claiming after their computation 3 (floor 4)
    cfg = TrainConfig(env="Hopper-v5", preset="fast", rounds=10, learners=3)
    stellaris = resolve(JobRequest.model_validate(cfg.job_request("j1"))).algo.stellaris
    assert (stellaris.schedule, stellaris.beta_floor, stellaris.claim_ahead) == ("horizon_floor", 7.0, True)
    assert aggregation_rule(stellaris, Plan()).beta_floor == 7.0
    after = load_config(_yaml(tmp_path, "learners: 3\noverrides: {stellaris: {claim_ahead: false}}\n"), {})
    stellaris = resolve(JobRequest.model_validate(after.job_request("j3"))).algo.stellaris
    assert (stellaris.beta_floor, stellaris.claim_ahead) == (4.0, False)
    set_floor = load_config(_yaml(tmp_path, "learners: 3\noverrides: {stellaris: {beta_floor: 1.5}}\n"), {})
    assert resolve(JobRequest.model_validate(set_floor.job_request("j2"))).algo.stellaris.beta_floor == 1.5


def test_a_knob_given_twice_in_the_yaml_with_different_values_is_named_both_ways(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"d: 0.9 and overrides.stellaris.d: 0.5 set the same knob"):
        load_config(_yaml(tmp_path, "d: 0.9\noverrides: {stellaris: {d: 0.5}}\n"), {})
    with pytest.raises(ConfigError, match=r"mode: 'async' and overrides.stellaris.rule: 'sync'"):
        load_config(_yaml(tmp_path, "mode: async\noverrides: {stellaris: {rule: sync}}\n"), {})
    assert load_config(_yaml(tmp_path, "d: 0.5\noverrides: {stellaris: {d: 0.5}}\n"), {}).d == 0.5  # agreeing


def test_a_flag_beats_the_yaml_file_its_overrides_stellaris_spelling_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _yaml(tmp_path, "d: 0.9\nv: 2.0\nssp_bound: 5\noverrides: {stellaris: {rho: 0.5, rule: sync}}\n")
    unflagged = _train_flags(monkeypatch, "--config", str(path))
    assert (unflagged.d, unflagged.v, unflagged.rho, unflagged.mode, unflagged.ssp_bound) == (0.9, 2.0, 0.5, "sync", 5)
    flagged = _train_flags(
        monkeypatch, "--config", str(path), "--d", "0.7", "--rho", "0.8", "--mode", "ssp", "--ssp-bound", "3"
    )
    assert (flagged.d, flagged.v, flagged.rho, flagged.mode, flagged.ssp_bound) == (0.7, 2.0, 0.8, "ssp", 3)
    request = flagged.job_request("j1").algo.stellaris
    assert (request.d, request.rho, request.rule, request.ssp_bound) == (0.7, 0.8, "ssp", 3)


def test_the_run_plan_is_built_once_and_both_schedules_read_it(tmp_path: Path) -> None:
    cfg = TrainConfig(env="Hopper-v5", preset="fast", total_steps=500_000)
    request = cfg.job_request("j1")
    assert request.plan == Plan(horizon_rounds=245, horizon_steps=500_000)  # 500k steps in 2048-step rounds
    spec = resolve(JobRequest.model_validate(request.model_dump(mode="json")))
    assert spec.plan == request.plan and aggregation_rule(spec.algo.stellaris, spec.plan).horizon_rounds == 245
    assert TrainConfig(env="Hopper-v5", rounds=10, total_steps=500_000).job_request("j").plan.horizon_rounds == 10
    assert TrainConfig(env="Hopper-v5", max_minutes=1.0).job_request("j").plan == Plan()  # bounded by time only
    # `overrides.stellaris.horizon_rounds` (an older run's config.yaml may hold it) sets the horizon alone
    held = load_config(_yaml(tmp_path, "overrides: {stellaris: {horizon_rounds: 300}}\n"), {})
    assert held.job_request("j").plan == Plan(horizon_rounds=300)
    assert held.overrides == {"stellaris": {"horizon_rounds": 300}}  # as written, so config.yaml resumes with it


def test_what_crosses_to_the_functions_is_the_typed_config_not_the_overrides(tmp_path: Path) -> None:
    import json

    from contract.knobs import Rule

    cfg = load_config(_yaml(tmp_path, "overrides: {lr: 0.001, network: {hidden: [8]}}\n"), {"mode": "ssp"})
    assert cfg.mode is Rule.SSP and cfg.model_dump(mode="json")["mode"] == "ssp"  # config.yaml keeps plain strings
    crossing = json.loads(json.dumps(cfg.job_request("j").model_dump(mode="json")))
    assert "overrides" not in crossing and "preset" not in crossing
    algo = crossing["algo"]
    assert (algo["algo"], algo["lr"], algo["network"]["hidden"]) == ("ppo", 0.001, [8])
    assert algo["stellaris"]["rule"] == "ssp"
    assert crossing["plan"] == {"horizon_rounds": 1, "horizon_steps": None}
    assert JobRequest.model_validate(crossing) == cfg.job_request("j")


def test_truncation_flags_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on = _yaml(tmp_path, "")
    assert _train_flags(monkeypatch, "--config", str(on)).truncation is True
    assert _train_flags(monkeypatch, "--config", str(on), "--no-truncation").truncation is False
    off = _yaml(tmp_path, "overrides: {stellaris: {truncation: false}}\n")
    assert _train_flags(monkeypatch, "--config", str(off)).truncation is False
    assert _train_flags(monkeypatch, "--config", str(off), "--truncation").truncation is True


def test_a_bad_knob_value_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="d: Input should be less than or equal to 1"):
        load_config(_yaml(tmp_path, "overrides: {stellaris: {d: 1.5}}\n"), {})
    with pytest.raises(ConfigError, match="softsync_k: Input should be greater than or equal to 1"):
        load_config(_yaml(tmp_path, ""), {"softsync_k": 0})


# -- where the functions run: backend, images, GPUs, device ---------------------------------------------------------


def test_the_process_backend_is_the_default_and_takes_no_image_or_gpus(tmp_path: Path) -> None:
    from importlib.metadata import version

    cfg = load_config(_yaml(tmp_path, ""), {})
    assert (cfg.backend, cfg.device, cfg.learner_gpus, cfg.parameter_gpus) == ("process", "auto", 0, 0)
    assert [cfg.role_image(r) for r in ("learner", "parameter", "actor")] == [None, None, None]
    assert [cfg.role_device(r) for r in ("learner", "parameter", "actor")] == ["auto", "auto", "cpu"]
    with pytest.raises(ConfigError, match=r"learner_gpus: 1 needs backend docker or ray, but backend is 'process'"):
        load_config(_yaml(tmp_path, "learner_gpus: 1\n"), {})
    with pytest.raises(
        ConfigError, match=r"image: 'x:1' needs backend docker, parameter_gpus: 2 needs backend docker or ray"
    ):
        load_config(_yaml(tmp_path, "image: x:1\nparameter_gpus: 2\n"), {})
    docker = load_config(_yaml(tmp_path, "backend: docker\n"), {})  # the project's CPU image where no GPU is asked
    assert {docker.role_image(r) for r in ("learner", "parameter", "actor")} == {
        f"stellaris/function-cpu:{version('stellaris')}"
    }


def test_images_gpus_and_device_with_the_docker_backend(tmp_path: Path) -> None:
    from importlib.metadata import version

    cfg = load_config(
        _yaml(tmp_path, "backend: docker\nimage: mine:1\nactor_image: act:2\nlearner_gpus: 1\nparameter_gpus: 1\n"),
        {"device": "cuda"},
    )
    assert [cfg.role_image(r) for r in ("learner", "parameter", "actor")] == ["mine:1", "mine:1", "act:2"]
    assert [cfg.role_gpus(r) for r in ("learner", "parameter", "actor")] == [1, 1, 0]
    assert [cfg.role_device(r) for r in ("learner", "parameter", "actor")] == ["cuda", "cuda", "cpu"]
    gpu = load_config(_yaml(tmp_path, "backend: docker\nlearner_gpus: 1\n"), {})
    assert gpu.role_image("learner") == f"stellaris/function:{version('stellaris')}"  # the CUDA image
    assert gpu.role_image("parameter") == f"stellaris/function-cpu:{version('stellaris')}"
    with pytest.raises(ConfigError, match=r"device: 'cuda' with backend 'docker' needs parameter_gpus > 0"):
        load_config(_yaml(tmp_path, "backend: docker\nlearner_gpus: 1\n"), {"device": "cuda"})
    with pytest.raises(ConfigError, match=r"backend: Input should be 'process', 'docker' or 'ray'"):
        load_config(_yaml(tmp_path, "backend: k8s\n"), {})
    with pytest.raises(ConfigError, match=r"device: Input should be 'auto', 'cpu' or 'cuda'"):
        load_config(_yaml(tmp_path, "device: tpu\n"), {})
    with pytest.raises(ConfigError, match=r"learner_gpus: Input should be greater than or equal to 0"):
        load_config(_yaml(tmp_path, "backend: docker\nlearner_gpus: -1\n"), {})


def test_placement_flags_beat_the_yaml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _yaml(tmp_path, "backend: docker\nimage: a:1\nlearner_image: l:1\nlearner_gpus: 2\ndevice: cpu\n")
    unflagged = _train_flags(monkeypatch, "--config", str(path))
    assert (unflagged.role_image("learner"), unflagged.role_image("actor"), unflagged.learner_gpus) == ("l:1", "a:1", 2)
    flagged = _train_flags(
        monkeypatch,
        "--config",
        str(path),
        "--learner-image",
        "l:2",
        "--image",
        "b:2",
        "--actor-image",
        "c:3",
        "--parameter-image",
        "p:4",
        "--learner-gpus",
        "1",
        "--parameter-gpus",
        "1",
        "--device",
        "cuda",
    )
    assert [flagged.role_image(r) for r in ("learner", "parameter", "actor")] == ["l:2", "p:4", "c:3"]
    assert (flagged.learner_gpus, flagged.parameter_gpus, flagged.device) == (1, 1, "cuda")
    process = _yaml(tmp_path, "learner_gpus: 0\n")
    assert _train_flags(monkeypatch, "--config", str(process), "--backend", "docker").backend == "docker"


def test_the_job_registers_each_role_where_the_config_places_it(tmp_path: Path) -> None:
    """The specs the gateway gets: backend named, image and GPUs for docker, the device in the environment."""
    from stellaris.platform.deployment import function_spec, placements

    docker = placements(load_config(_yaml(tmp_path, "backend: docker\nimage: img:1\nlearner_gpus: 1\n"), {}))
    learner = function_spec("j-learner", "learner", docker["learner"], {"A": "1"}, max_instances=2)
    assert (learner.backend, learner.image, learner.resources.gpus, learner.target, learner.max_instances) == (
        "docker",
        "img:1",
        1,
        "functions.handlers.learner:handle",
        2,
    )
    assert learner.env == {"A": "1", "STELLARIS_DEVICE": "auto"}
    actor = function_spec("j-actor", "actor", docker["actor"], {})
    assert (actor.backend, actor.image, actor.resources.gpus, actor.env) == (
        "docker",
        "img:1",
        0,
        {"STELLARIS_DEVICE": "cpu"},
    )
    process = placements(load_config(_yaml(tmp_path, ""), {}))
    parameter = function_spec("j-parameter", "parameter", process["parameter"], {})
    assert (parameter.backend, parameter.image, parameter.resources.gpus) == ("process", None, 0)


def test_gpu_shares_custom_resources_and_the_cluster_with_the_ray_backend(tmp_path: Path) -> None:
    cfg = load_config(
        _yaml(tmp_path, "backend: ray\nlearner_gpus: 0.25\nlearner_resources: {gpu_node: 0.01}\n"),
        {"actor_resources": {"cpu_node": 0.5}, "ray_address": "127.0.0.2:6390"},
    )
    assert [cfg.role_gpus(r) for r in ("learner", "parameter", "actor")] == [0.25, 0, 0]
    assert [cfg.role_resources(r) for r in ("learner", "parameter", "actor")] == [
        {"gpu_node": 0.01},
        {},
        {"cpu_node": 0.5},
    ]
    assert cfg.role_image("learner") is None  # ray actors run the project installed on the nodes
    with pytest.raises(ConfigError, match=r"learner_gpus 0.5 is fractional: a container takes whole GPUs"):
        load_config(_yaml(tmp_path, "backend: docker\nlearner_gpus: 0.5\n"), {})
    with pytest.raises(ConfigError, match=r"image: 'x:1' needs backend docker, but backend is 'ray'"):
        load_config(_yaml(tmp_path, "backend: ray\nimage: x:1\n"), {})
    with pytest.raises(ConfigError, match=r"ray_address: '10.0.0.9:6379' needs backend ray, but backend is 'docker'"):
        load_config(_yaml(tmp_path, "backend: docker\nray_address: 10.0.0.9:6379\n"), {})
    with pytest.raises(ConfigError, match=r"needs parameter_gpus > 0"):
        load_config(_yaml(tmp_path, "backend: ray\nlearner_gpus: 0.25\n"), {"device": "cuda"})
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: a cluster there cannot reach an embedded Redis.
    with pytest.raises(ConfigError, match=r"ray_address '192.0.2.1:6379' is a cluster on other machines.*redis-url"):
        load_config(_yaml(tmp_path, "backend: ray\nray_address: 192.0.2.1:6379\n"), {})
    remote = load_config(
        _yaml(tmp_path, "backend: ray\nray_address: 192.0.2.1:6379\n"), {"redis_url": "redis://r:6379"}
    )
    assert remote.ray_address == "192.0.2.1:6379"


def test_ray_resource_flags_parse_name_amount_pairs() -> None:
    from stellaris.config import ConfigError
    from stellaris.train_options import resources as _resources

    assert _resources("--learner-resources", "gpu_node=0.01, fast=2") == {"gpu_node": 0.01, "fast": 2.0}
    with pytest.raises(ConfigError, match=r"--actor-resources: 'cpu_node' is not name=amount"):
        _resources("--actor-resources", "cpu_node")


def test_yaml_env_module_and_env_kwargs_reach_the_job_request(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env_module: tests.stellaris.custom_env\nenv: PickTarget-v0\nenv_kwargs: {size: 4}\nrounds: 1\n")
    request = JobRequest.model_validate(load_config(cfg, {}).job_request("j"))
    spec = resolve(request)
    assert (spec.env_module, spec.env_id, spec.env_kwargs) == (
        "tests.stellaris.custom_env",
        "PickTarget-v0",
        {"size": 4},
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"env_module": "no_such_module_xyz"},
            "env_module\n  Value error, cannot import env_module 'no_such_module_xyz'",
        ),
        ({"env": "no_such_module_xyz:Env"}, "env\n  Value error, cannot import the module of env"),
        ({"env": "Nope-v0", "env_module": "tests.stellaris.custom_env"}, "after importing env_module"),
        ({"env": "CartPole-v1", "env_kwargs": "3"}, "env_kwargs\n  Value error, env_kwargs must be a JSON object"),
        ({"env": "CartPole-v1", "env_kwargs": {"bogus": 1}}, "env_kwargs\n  Value error, gymnasium.make('CartPole-v1'"),
    ],
)
def test_a_bad_env_field_is_named(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        TrainConfig(rounds=1, **fields)  # type: ignore[arg-type]
    assert message in str(err.value)
