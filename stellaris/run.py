"""`stellaris train`: platform up, trainer loop with live progress, clean stop on Ctrl-C, exit code."""

from __future__ import annotations

import contextlib
import errno
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from cache import RedisServerDied
from cache.connection import redact_url
from stellaris.config import TrainConfig
from stellaris.platform.cache_faults import CacheLost, cache_full, cache_lost, resumes_from_env
from stellaris.platform.cache_watch import CacheWatch
from stellaris.platform.local import Platform
from stellaris.platform.secrets import missing_secret
from stellaris.round.trainer import Trainer, threads_env
from stellaris.rundir.outputs import RunDir, fmt, read_state
from stellaris.rundir.progress import Standing, clock, sparkline

TOKEN_FILE = "gateway-token"  # the local gateway's bearer token, for scraping /metrics during the run (0600)


def _times(standing: Standing) -> str:
    """elapsed and ETA against the run's budget (the first of rounds, steps and minutes to run out)."""
    return f"elapsed {clock(standing.elapsed_s)} eta {clock(standing.eta_s())}"


def _progress(
    cfg: TrainConfig, standing: Standing, cost: float, row: dict | None, steps_per_s: float, history: list[float]
) -> Table:
    """The live table: `cfg`, the trainer's (its counts as the last round left them), where the run stands, and
    what it cost so far."""
    table = Table.grid(padding=(0, 2))
    budget = cfg.rounds or "-"
    table.add_row(
        f"[bold]{cfg.env}[/] {cfg.algo}/{cfg.preset} mode={cfg.mode}",
        f"round {standing.round_k}/{budget}",
        f"env steps {standing.env_steps:,}",
        f"{steps_per_s:,.0f} steps/s",
        _times(standing),
    )
    if row is not None:
        table.add_row(
            f"reward {fmt(row['train_reward_mean'])} (max {fmt(row['train_reward_max'])})",
            f"staleness {fmt(row['staleness_mean'], '.2f')} bound {fmt(row['staleness_bound'], '.2f')}",
            f"learners in flight {row.get('max_in_flight', 0)}/{cfg.learners}",
            f"cost ${cost:.4f}",
            f"eval {fmt(row['eval_reward_mean'])}" if row.get("eval_episodes") else "",
        )
        table.add_row(f"return history {sparkline(history)}", "", "", "", "")
    return table


def _show_gateway(console: Console, platform: Platform, cfg: TrainConfig, run_path: Path) -> Path | None:
    """Print where the gateway is, so that its /metrics can be scraped during the run: for the local gateway, with
    its token in a 0600 file of the run directory (removed when the run ends), returned."""
    url = platform.gateway_url
    if cfg.gateway_url is not None or platform.gateway_token is None:
        console.print(f"gateway {url} (the token given)", highlight=False, soft_wrap=True)
        return None
    token_file = run_path / TOKEN_FILE
    token_file.touch(mode=0o600)
    token_file.write_text(platform.gateway_token)
    console.print(
        f'gateway {url}, token in {token_file} (metrics: curl -H "Authorization: Bearer $(cat {token_file})" '
        f"{url}/metrics)",
        highlight=False,
        soft_wrap=True,
    )
    return token_file


def _raise_if_cache_died(watch: CacheWatch, exc: Exception) -> None:
    """Whatever failed (a 502 from a function, a connection error here), a dead or hung embedded Redis is the cause
    to report: one line with its exit code and the tail of its log, not the traceback of whatever noticed first."""
    try:
        watch.raise_if_dead_or_hung()
    except RedisServerDied as died:
        raise died from exc


def _nothing_to_resume(cfg: TrainConfig) -> str | None:
    """What to say when the run to resume has spent its budget already (no platform is started for no round)."""
    state = read_state(cfg.run_dir())
    if state is None:
        return None
    done_rounds, steps = int(state.get("round", 0)), int(state.get("env_steps", 0))
    spent = Standing.of(cfg, elapsed_s=float(state.get("elapsed_s", 0.0)), round_k=done_rounds, env_steps=steps).spent()
    if spent is None:
        return None
    return (
        f"nothing to resume: {cfg.run_dir()} has done {done_rounds} rounds and {steps} env steps, which spends its "
        f"budget ({spent}); give a larger --rounds, --total-steps or --max-minutes to train on"
    )


def run_training(cfg: TrainConfig, *, resume: bool = False) -> int:
    """Train, resuming from the last checkpoint each time the cache loses the job's data (stellaris/platform/
    cache_faults.py), up to $STELLARIS_CACHE_LOSS_RESUMES times."""
    console = Console(stderr=True)
    try:
        resumes = resumes_from_env()
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    losses = 0
    while True:
        try:
            return _run_epoch(cfg, console, resume=resume)
        except (CacheLost, RedisServerDied) as lost:
            losses += 1
            if (code := _after_cache_loss(cfg, console, lost, losses, resumes)) is not None:
                return code
            resume = read_state(cfg.run_dir()) is not None
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            console.print(f"[red]error:[/] {_disk_full(cfg.run_dir(), exc)}", highlight=False, soft_wrap=True)
            return 1


def _after_cache_loss(
    cfg: TrainConfig, console: Console, lost: CacheLost | RedisServerDied, losses: int, resumes: int
) -> int | None:
    """Said, what the `losses`-th loss of the job's data (gone from its Redis, or with its embedded Redis, which
    keeps nothing on disk) means for the run: None to resume from its last checkpoint in a new epoch, on a new
    embedded Redis where that one died; else the exit code."""
    state = read_state(cfg.run_dir())
    headline = lost.headline if isinstance(lost, RedisServerDied) else str(lost)  # a dead server's log tail apart
    if state is not None and _nothing_to_resume(cfg) is not None:  # lost as the job's data was being deleted
        console.print(
            f"[yellow]cache lost[/] after the last round: {headline}; the run is complete, outputs in {cfg.run_dir()}",
            highlight=False,
            soft_wrap=True,
        )
        return 0
    if losses > resumes:
        hint = _resume_hint(cfg.run_dir())
        then = "\n" if isinstance(lost, RedisServerDied) else "; "  # after a log tail, a line of its own
        console.print(f"[red]error:[/] {lost}" + (f"{then}{hint}" if hint else ""), highlight=False, soft_wrap=True)
        return 1
    at = f"round {state.get('round', 0)}'s checkpoint" if state is not None else "the start (no checkpoint yet)"
    console.print(
        f"[yellow]cache lost[/]: {headline}; resuming from {at} ({losses} of at most {resumes} such resumes)",
        highlight=False,
        soft_wrap=True,
    )
    if isinstance(lost, RedisServerDied):
        console.print(f"its last log lines:\n{lost.log_tail}", highlight=False, soft_wrap=True)
    return None


def _resume_hint(path: Path) -> str | None:
    """For a run that stopped after its first checkpoint: where it can go on from."""
    state = read_state(path) if path.is_dir() else None
    if state is None:
        return None
    return f"its checkpoint of round {state.get('round', 0)} is intact: resume with `stellaris train --resume {path}`"


def _disk_full(path: Path, exc: OSError) -> str:
    """What a full disk (or quota) under the run directory means for the run, and what to do."""
    then = _resume_hint(path) or "it has no checkpoint yet: start it again"
    return f"no room to write the run directory {path} ({exc}): make room; {then}"


def _open_run(cfg: TrainConfig, console: Console, *, resume: bool) -> tuple[RunDir, dict[str, Any] | None] | int:
    """The run directory and, on resume, its checkpoint (the rows written after it rewound); an exit code instead when
    the epoch cannot (a secret missing, no checkpoint) or need not (the run finished) start."""
    if (missing := missing_secret(cfg.redis_url, cfg.gateway_token)) is not None:
        console.print(f"[red]error:[/] {missing}", highlight=False, soft_wrap=True)
        return 2
    if resume and (done := _nothing_to_resume(cfg)) is not None:
        console.print(done, highlight=False, soft_wrap=True)
        return 0
    run = RunDir(cfg.run_dir(), resume=resume)  # RunDirError: a run there already, without --resume
    state = run.load_state() if resume else None
    if resume and state is None:
        run.close()
        run.discard()
        console.print(f"[red]error:[/] {run.path} has no checkpoint (state.json) to resume from", soft_wrap=True)
        return 2
    if state is not None:
        run.rewind(state)  # rows the dead run wrote after its checkpoint
    return run, state


def _show_placement(console: Console, cfg: TrainConfig) -> None:
    """Where the functions run, when not in local processes."""
    roles = ("learner", "parameter", "actor") if cfg.actor_kind == "serverless" else ("learner", "parameter")
    if cfg.backend == "docker":
        where = ", ".join(f"{r} {cfg.role_image(r)} ({cfg.role_gpus(r)} GPU)" for r in roles)
        console.print(f"functions in containers: {where}; device {cfg.device}", highlight=False, soft_wrap=True)
    elif cfg.backend == "ray":
        where = ", ".join(f"{r} {cfg.role_gpus(r)} GPU {cfg.role_resources(r) or ''}".rstrip() for r in roles)
        cluster = cfg.ray_address or "a private local Ray"
        console.print(f"functions on Ray ({cluster}): {where}; device {cfg.device}", highlight=False, soft_wrap=True)


def _play_rounds(trainer: Trainer, console: Console) -> None:
    """Rounds until the budget is spent. A terminal gets the live table; logs and CI one plain line per round, and no
    Live, whose last frame would leave the summary on its line."""
    start_steps, t0 = trainer.env_steps, time.monotonic()
    history: list[float] = []
    live = Live(
        _progress(trainer.cfg, trainer.standing(), trainer.cost, None, 0.0, history),
        console=console,
        refresh_per_second=4,
    )
    with live if console.is_terminal else contextlib.nullcontext():
        while not trainer.done():
            row = trainer.step()
            history.append(float(row["train_reward_mean"]))
            rate = (trainer.env_steps - start_steps) / max(time.monotonic() - t0, 1e-9)
            if console.is_terminal:
                live.update(_progress(trainer.cfg, trainer.standing(), trainer.cost, row, rate, history))
            else:
                console.print(
                    f"round {row['round_id']} env_steps {row['env_steps']} reward {fmt(row['train_reward_mean'])} "
                    f"cost {row['cost']:.6f} {_times(trainer.standing())}",
                    highlight=False,
                )


def _reraise(exc: Exception, *, watch: CacheWatch, trainer: Trainer, cache_url: str | None, run_path: Path) -> None:
    """Raise `exc`, or what it means: the cache died, was lost or is full (once the job's data is in it); with the
    resume hint as its last line."""
    _raise_if_cache_died(watch, exc)
    reported: Exception = exc
    if cache_url is not None:
        where = redact_url(cache_url)
        reported = cache_lost(trainer.job, where, exc) or cache_full(trainer.job, where, exc) or exc
    if (hint := _resume_hint(run_path)) is not None:
        reported.add_note(hint)  # the CLI's error line ends with it
    if reported is exc:
        raise exc
    raise reported from exc


def _train(cfg: TrainConfig, console: Console, run: RunDir, state: dict[str, Any] | None) -> Trainer:
    """The epoch's platform, its trainer and its rounds. The gateway's token file is removed however it ends."""
    token_file: Path | None = None
    try:
        with Platform(
            redis_url=cfg.redis_url,
            gateway_url=cfg.gateway_url,
            gateway_token=cfg.gateway_token,
            backend=cfg.backend,
            ray_address=cfg.ray_address,
            instance_env=threads_env(cfg),
        ) as p:
            trainer = Trainer(cfg, p, run, state=state)
            assert p.cache is not None  # set on entry
            watch = CacheWatch(p.cache.server, url=p.cache.url).start()
            in_rounds = False
            try:
                trainer.setup()
                console.print(f"run directory: {run.path}", highlight=False, soft_wrap=True)  # a failed start has none
                token_file = _show_gateway(console, p, cfg, run.path)
                in_rounds = True  # the job's data is in the cache from here on
                _play_rounds(trainer, console)
                in_rounds = False
                trainer.finish()
            except Exception as exc:
                _reraise(
                    exc, watch=watch, trainer=trainer, cache_url=p.cache.url if in_rounds else None, run_path=run.path
                )
            finally:
                watch.stop()
                trainer.close()
        return trainer
    finally:
        if token_file is not None:
            token_file.unlink(missing_ok=True)


def _run_epoch(cfg: TrainConfig, console: Console, *, resume: bool) -> int:
    if isinstance(opened := _open_run(cfg, console, resume=resume), int):
        return opened
    run, state = opened
    _show_placement(console, cfg)
    completed, trainer = False, None
    try:
        trainer = _train(cfg, console, run, state)
        completed = True
    except KeyboardInterrupt:
        if run.load_state() is None:
            console.print("[yellow]interrupted[/] before the first round finished: nothing to resume")
        else:
            console.print(f"[yellow]interrupted[/]: stopped cleanly; resume with `stellaris train --resume {run.path}`")
        return 130
    finally:
        run.close()
        if not completed and run.load_state() is None:  # never started: no directory left to resume or to refuse
            run.discard()
    console.print(
        f"done: {trainer.round} rounds, cost ${trainer.cost:.4f}; outputs in {run.path}",
        highlight=False,
        soft_wrap=True,
    )
    return 0
