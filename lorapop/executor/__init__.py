"""Sandboxed execution of untrusted Python (sandbox.py says what is and is not isolated). Floor 1: imports only the
bottom floor (progress, raycluster, tmpdirs); the task types and everything above call it through ``Executor``."""

from lorapop.executor.base import ExecResult, Executor, ExecutorConfig, IsolationError
from lorapop.executor.sandbox import SandboxExecutor

__all__ = ["ExecResult", "Executor", "ExecutorConfig", "IsolationError", "SandboxExecutor"]
