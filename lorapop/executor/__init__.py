"""Sandboxed execution of untrusted Python (see sandbox.py for what is and is not isolated)."""

from lorapop.executor.sandbox import ExecResult, Executor, ExecutorConfig, SandboxExecutor

__all__ = ["ExecResult", "Executor", "ExecutorConfig", "SandboxExecutor"]
