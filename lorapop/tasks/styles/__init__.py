"""Proposal styles, one module each, registered by name (``selfplay.proposal_style``; docs/ARCHITECTURE.md, "Proposal
styles and prompt formats", says how to add one). Imports only tasks/ and configlib; a style's reference tasks and
probe shapes live in its family module (tasks/<name>_family.py)."""

from lorapop.tasks.styles.base import STYLES, ProposalStyle, proposal_style, register_style
from lorapop.tasks.styles.azr import AZR
from lorapop.tasks.styles.input_first import INPUT_FIRST
from lorapop.tasks.styles.expression import EXPRESSION, OneBlockStyle
from lorapop.tasks.styles.selection import SELECTION

__all__ = ["AZR", "EXPRESSION", "INPUT_FIRST", "SELECTION", "STYLES", "OneBlockStyle", "ProposalStyle",
           "proposal_style", "register_style"]
