"""What a clip's caption and character states are, how they are validated, and the text built from them.

Every other module (import files, VLM prompts, HTTP prompts, training text) names the fields through
the constants below, so a renamed field cannot silently drift between the writer and the reader.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from animegamer.contracts.shards import CAPTION_FIELDS, STATES
from animegamer.contracts.states import CHARACTER_STATES, STATE_ALLOWED_VALUES

# --------------------------------------------------------------------------- field names
# The caption's slots and the states object are spelt as the clip shards' records spell them; import
# records and model answers use the same keys.
CHARACTER, MOTION, ADVERB, ENVIRONMENT, TIME_OF_DAY = CAPTION_FIELDS
STATE_FIELDS: tuple[str, ...] = CHARACTER_STATES  # the states a caption gives (the motion level is measured)

# The keys a model answer must have, exactly (the import format adds film/start/end).
ANSWER_FIELDS: tuple[str, ...] = CAPTION_FIELDS + (STATES,)

# --------------------------------------------------------------------------- templates
INSTRUCTION_TEMPLATE = "Character: {character}; Motion: {adverb} {motion}; Background: {time_of_day} {environment}."
MOTION_TEXT_TEMPLATE = "{adverb} {motion}"


def _require_exact_keys(data: Mapping[str, Any], expected: tuple[str, ...], what: str) -> None:
    """Missing keys and unknown keys are both errors: a typo ("enviroment") must not pass as data."""
    missing = [key for key in expected if key not in data]
    if missing:
        raise ValueError(f"{what}: missing field(s) {', '.join(repr(k) for k in missing)}")
    extra = sorted(str(key) for key in data if key not in expected)
    if extra:
        raise ValueError(f"{what}: unexpected field(s) {', '.join(repr(k) for k in extra)}")


@dataclass(frozen=True)
class Caption:
    """The five caption slots of one clip; every slot is a non-empty, stripped string."""

    character: str
    motion: str
    adverb: str
    environment: str
    time_of_day: str

    def __post_init__(self) -> None:
        for name in CAPTION_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"caption field {name!r} must be a string, got {type(value).__name__} {value!r}")
            if not value.strip():
                raise ValueError(f"caption field {name!r} must be a non-empty string")
            if value != value.strip():
                raise ValueError(f"caption field {name!r} has leading/trailing whitespace: {value!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Caption":
        """Read the five slots from ``data`` (other keys are ignored: callers check their own format).

        Strings are stripped so that "softly " from a model or a hand-written file is accepted.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"caption must be an object, got {type(data).__name__}")
        values: dict[str, Any] = {}
        for name in CAPTION_FIELDS:
            if name not in data:
                raise ValueError(f"caption: missing field {name!r}")
            value = data[name]
            values[name] = value.strip() if isinstance(value, str) else value
        return cls(**values)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class States:
    """The three character-state changes of one clip, each restricted to its allowed integers."""

    SC: int
    ET: int
    ST: int

    def __post_init__(self) -> None:
        for name in STATE_FIELDS:
            value = getattr(self, name)
            allowed = STATE_ALLOWED_VALUES[name]
            # bool is an int subclass: True would otherwise pass as SC=1 and hide a type confusion.
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"state {name!r} must be an integer in {list(allowed)}, got {type(value).__name__} {value!r}"
                )
            if value not in allowed:
                raise ValueError(f"state {name!r} must be one of {list(allowed)}, got {value!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "States":
        """Exactly the keys SC, ET, ST with integer values (no floats, strings or booleans)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{STATES!r} must be an object, got {type(data).__name__}")
        _require_exact_keys(data, STATE_FIELDS, STATES)
        return cls(**{name: data[name] for name in STATE_FIELDS})

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def build_instruction(caption: Caption) -> str:
    """The per-clip instruction text the game model is conditioned on."""
    return INSTRUCTION_TEMPLATE.format(**caption.to_dict())


def build_motion_text(caption: Caption) -> str:
    """The short motion phrase ("softly talk") used where only the action matters."""
    return MOTION_TEXT_TEMPLATE.format(**caption.to_dict())


# --------------------------------------------------------------------------- model answers
def extract_first_json_object(text: str) -> str:
    """Return the first balanced ``{...}`` of ``text``, aware of JSON strings and escapes.

    Models wrap answers in ```json fences or prose; braces inside string values (e.g. "a {b}") must not
    end the object early, so a plain regex is not enough.
    """
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object found in the answer")
    depth = 0
    in_string = False
    escaped = False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start : index + 1]
    raise ValueError("unbalanced JSON object in the answer (missing closing '}')")


def parse_caption_json(text: str) -> tuple[Caption, States]:
    """Strictly parse a model's answer into (Caption, States).

    Accepted: one JSON object with exactly the keys of :data:`ANSWER_FIELDS`, optionally inside ```json
    fences or surrounded by prose (the first balanced object is used). Anything missing, unknown or of
    the wrong type raises ``ValueError`` whose message is fit to be shown back to the model on a retry.
    """
    if not isinstance(text, str):
        raise ValueError(f"answer must be text, got {type(text).__name__}")
    snippet = extract_first_json_object(text)
    try:
        data = json.loads(snippet)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} at char {exc.pos}") from exc
    if not isinstance(data, dict):  # defensive: a balanced {...} always decodes to a dict
        raise ValueError(f"answer must be a JSON object, got {type(data).__name__}")
    _require_exact_keys(data, ANSWER_FIELDS, "answer")
    return Caption.from_dict(data), States.from_dict(data[STATES])
