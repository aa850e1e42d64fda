"""Program diagnostics (complexity descriptors) and program-space coverage (CVT archive). Importing the package is
cheap; pyribs is imported only when a `CoverageTracker` generates centroids other than the shipped default ones."""

from lorapop.diagnostics.complexity import DESCRIPTOR_KEYS, program_descriptors
from lorapop.diagnostics.coverage import COVERAGE_DESCRIPTORS, CoverageConfig, CoverageTracker

__all__ = ["COVERAGE_DESCRIPTORS", "DESCRIPTOR_KEYS", "CoverageConfig", "CoverageTracker", "program_descriptors"]
