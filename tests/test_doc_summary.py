"""Commands' ``--help`` descriptions: a docstring's whole first paragraph, in plain words."""
from __future__ import annotations

import pytest

from animegamer.utils.text import doc_summary


def test_the_first_paragraph_on_one_line_without_rest_marks() -> None:
    doc = """Reads ``clips/`` with :func:`~animegamer.data.shards.folder_shards`, a line
    that goes on past its first line:

    - a list the description leaves out
    """
    assert doc_summary(doc) == "Reads clips/ with animegamer.data.shards.folder_shards, a line that goes on past " \
                               "its first line."
    assert doc_summary(None) == doc_summary("") == ""


def test_a_probes_help_ends_its_sentence(capsys) -> None:
    from benchmarks.known_answer import latent_probe

    with pytest.raises(SystemExit) as shown:
        latent_probe.main(["--help"])
    assert shown.value.code == 0
    description = " ".join(capsys.readouterr().out.split("\n\n")[1].split())
    assert description == doc_summary(latent_probe.__doc__)
    assert description.endswith("frames'.") and ":mod:" not in description
