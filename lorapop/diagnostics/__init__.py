"""Program diagnostics (complexity descriptors) and program-space coverage (CVT archive). Floor 1: imports nothing of
lorapop above the bottom floor; pyribs is imported only when a `CoverageTracker` makes centroids other than the
shipped default ones."""

from lorapop.diagnostics.complexity import DESCRIPTOR_KEYS, program_descriptors
from lorapop.diagnostics.coverage import COVERAGE_DESCRIPTORS, CoverageConfig, CoverageTracker

__all__ = ["COVERAGE_DESCRIPTORS", "DESCRIPTOR_KEYS", "CoverageConfig", "CoverageTracker", "program_descriptors"]
