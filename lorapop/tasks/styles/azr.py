"""``selfplay.proposal_style: azr`` (the default; the paper's setting and the 7B configs): the program block, then
the input block, references shown with their outputs and a format example, as AZR asks. Every task type's own
layout is this one (lorapop/tasks/common.py), so the style adds nothing to :class:`ProposalStyle`; under
``prompt_format: azr`` it is the only style AZR's proposer prompt can ask in (docs/METHOD.md, "Proposal styles")."""

from __future__ import annotations

from lorapop.tasks.styles.base import ProposalStyle, register_style


class AzrStyle(ProposalStyle):
    name = "azr"
    seed_files = ("seeds/azr_7b_coder_seed_io.jsonl", "seeds/azr_7b_coder_code_f_seed_io.jsonl")


AZR = register_style(AzrStyle())
