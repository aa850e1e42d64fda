"""Task domain: code_o (deduction), code_i (abduction), code_f (induction) from Absolute Zero Reasoner, the proposal
styles and their families (``*_family.py``), prompt formats. Floor 2: imports the engine's and executor's types,
configlib, data; never the config, training, evaluation or commands."""

from lorapop.tasks.base import Answer, Invalid, Outcome, ParseError, Proposal, Task, TaskType
from lorapop.tasks.buffer import TaskBuffer, identity_task, read_seed_file
from lorapop.tasks.code_f import CodeF
from lorapop.tasks.code_i import CodeI
from lorapop.tasks.code_o import CodeO
from lorapop.tasks.common import DETERMINISM_SEEDS
from lorapop.tasks.rewards import student_reward, teacher_reward

TASK_TYPES: dict[str, TaskType] = {"code_o": CodeO(), "code_i": CodeI(), "code_f": CodeF()}

__all__ = ["TASK_TYPES", "Answer", "CodeF", "CodeI", "CodeO", "DETERMINISM_SEEDS", "Invalid", "Outcome",
           "ParseError", "Proposal", "Task", "TaskBuffer", "TaskType", "identity_task", "read_seed_file",
           "student_reward", "teacher_reward"]
