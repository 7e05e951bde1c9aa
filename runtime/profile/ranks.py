"""`mode=profile` with tp > 1: the layout's ranks spawned and watched as `mode=real` spawns them
(runtime.distributed: one process per GPU, NCCL on GPU, gloo on CPU). The TP leader runs the profile
through its runner, whose launches hand each step to the group; the other ranks run the steps they
receive. A rank that dies stops the run naming it (RankFailed). Imports torch in the ranks only.
"""
from __future__ import annotations

import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def profile_on_ranks(cfg: DictConfig, core, directory: Path, sections: tuple[str, ...]) -> dict:
    """Spawn the tp ranks of one replica, profile `sections` on the leader into `directory`; the leader's
    result (as run_profile returns it)."""
    from runtime.distributed.app import run_job

    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    cfg.profile.out_dir, cfg.profile.sections = str(directory), ",".join(sections)
    return run_job(cfg, core, directory, (lead_profile, follow_steps), "profile")


def lead_profile(task, cfg, core, runner) -> dict:
    """The TP leader: the profile, through a runner whose launches reach the group."""
    from runtime.profile.app import profile_runner

    sections = tuple(str(cfg.profile.sections).split(","))
    return profile_runner(cfg, core, runner, Path(cfg.profile.out_dir), sections, time.perf_counter())


def follow_steps(runner, channel) -> dict:
    """A rank other than the leader: run every step the leader launches (runtime.distributed.worker.follow),
    eagerly while it says so, behind a sleep kernel when it says so, until its STOP. Returns how many steps ran."""
    from runtime.distributed.worker import follow
    from runtime.profile.timing import EagerDecode, SleepBeforeStep, eager_decode

    eager: list = []              # the open eager_decode block while the leader's steps run eagerly

    def control(message) -> bool:
        if isinstance(message, SleepBeforeStep):     # the leader times the next step with its launch hidden
            if runner.device.type == "cuda":
                import torch
                torch.cuda._sleep(message.cycles)
            return True
        if not isinstance(message, EagerDecode):
            return False
        if message.on and not eager:
            eager.append(eager_decode(runner))
            eager[0].__enter__()
        elif not message.on and eager:
            eager.pop().__exit__(None, None, None)
        return True

    return {"steps": follow(runner, channel, control=control)}
