"""Sandboxed execution of untrusted Python (see sandbox.py for what is and is not isolated)."""

from lorapop.executor.sandbox import ExecResult, Executor, ExecutorConfig, IsolationError, SandboxExecutor

__all__ = ["ExecResult", "Executor", "ExecutorConfig", "IsolationError", "SandboxExecutor"]
