"""The only package that knows devices, processes, collectives, precision and torch_xla."""

from anysr.accelerators.base import Accelerator, LaunchPlan
from anysr.accelerators.launch import create_accelerator, launch, resolve_plan

__all__ = ["Accelerator", "LaunchPlan", "create_accelerator", "launch", "resolve_plan"]
