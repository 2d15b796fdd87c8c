"""Job planner (``hybridrl plan``): per-device memory of every role, the largest micro-batch with headroom, memory
savers, a roofline step time and the run's cost — before any GPU is rented. See :func:`plan_job`."""

from hybridrl.planner.hardware import GPUS, GpuSpec, gpu_spec
from hybridrl.planner.memory_plan import MemoryPlan, RoleMemory, Setup, Shapes, plan_memory, setup_from
from hybridrl.planner.recommend import Recommendation, recommend
from hybridrl.planner.report import JobPlan, format_plan, plan_job, shapes_of
from hybridrl.planner.time_plan import StepTime, roofline_step_time, run_cost

__all__ = ["GPUS", "GpuSpec", "JobPlan", "MemoryPlan", "Recommendation", "RoleMemory", "Setup", "Shapes", "StepTime",
           "format_plan", "gpu_spec", "plan_job", "plan_memory", "recommend", "roofline_step_time", "run_cost",
           "setup_from", "shapes_of"]
