"""The pipeline page's copy of what a model captioner must answer is the prompt the pipeline sends."""
from __future__ import annotations

import re
from pathlib import Path

from data_pipeline.captioners.fields import ANSWER_FIELDS, STATE_FIELDS
from data_pipeline.captioners.prompting import PROMPT

PIPELINE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "pipeline.md"
# The block after the comment that names the prompt's source.
BLOCK = re.compile(r"<!-- the prompt as sent: data_pipeline/captioners/prompting\.py's PROMPT.*?-->\n```text\n(.*?)\n```",
                   re.DOTALL)


def test_the_pipeline_page_shows_the_prompt_the_captioners_send():
    [documented] = BLOCK.findall(PIPELINE_PAGE.read_text())
    assert documented == PROMPT, ("docs/pipeline.md's copy of the caption prompt is out of date: paste the output of "
                                  "python -c 'from data_pipeline.captioners.prompting import PROMPT; print(PROMPT)'")
    # every key the answer is parsed with is named in it
    assert all(f'"{key}"' in documented for key in (*ANSWER_FIELDS, *STATE_FIELDS))
