"""Contention-aware block allocation (Libra): profile, model, plan, simulate.

    from hpccoll.tuning import Workload, Profile, plan, simulate
    result = plan(Workload.of(nbytes, compute), Profile.load("profile.h5"))
    result.plan.ends, result.plan.blocks, result.time

Importing this package does not import MPI; the profiler (``profiler``) and the
runtime (``hpccoll.bucketer``) do.
"""
from .model import Plan, Workload, evaluate
from .planner import PlanResult, plan
from .profile import Profile
from .simulate import Timeline, simulate

__all__ = ["Workload", "Plan", "Profile", "PlanResult", "Timeline", "plan", "evaluate", "simulate"]
