"""One version of an experience library: the Library model, its format tags and its lookups.

A version is what an on-chain root and an IPFS CID commit to: its experiences (experience.py) in canonical
order, sorted by id, the base model they were made on, a description, its version number and the root of
the version it was derived from ("" for a genesis). `schema` names the oldest format that holds its
experiences (schema_for): 1 for lessons only, 2 with worked examples, 3 when an example's answer is a code
block (worked_example.py), and 4 whatever its experiences once it names its base model's weights by their
SHA-256 (`base_model_sha256`, zoo.inference.provenance.weights), a field older formats do not have.
canonical.py encodes and decodes a version; merkle.py builds the tree over it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable

from msgspec import Struct

from zoo.registry.errors import NotFound, ValidationError
from zoo.registry.experience import EXAMPLE, Experience
from zoo.registry.validation import (
    MAX_NAME_CHARS,
    STRUCT_OPTIONS,
    Problem,
    Problems,
    as_name,
    build_struct,
    check_clean,
    checked_fields,
    clean_string,
)
from zoo.registry.worked_example import is_code_answer

MAX_DESCRIPTION_CHARS = 4000
MAX_JSON_INT = (1 << 53) - 1  # the largest integer every JSON reader (JavaScript included) reads exactly
ROOT_RE = re.compile(r"0x[0-9a-f]{64}")
SCHEMA_V1 = "zoo.experience-library/1"
SCHEMA_V2 = "zoo.experience-library/2"
SCHEMA_V3 = "zoo.experience-library/3"
SCHEMA_V4 = "zoo.experience-library/4"
SHA256_RE = re.compile(r"[0-9a-f]{64}")


def schema_for(experiences: Iterable[Experience], base_model_sha256: str = "") -> str:
    """The oldest library format that holds these experiences: 1 for lessons only, 2 with worked examples,
    3 when an example's answer is a code block (a reader of format 2 would refuse its lines); 4 for any of
    them once the library names its base model's hash (a reader of format 3 would refuse that field)."""
    if base_model_sha256:
        return SCHEMA_V4
    answers = [e.answer for e in experiences if e.kind == EXAMPLE]
    if not answers:
        return SCHEMA_V1
    return SCHEMA_V3 if any(a is not None and is_code_answer(a) for a in answers) else SCHEMA_V2


class Library(Struct, **STRUCT_OPTIONS, kw_only=True, omit_defaults=True):  # type: ignore[call-arg]
    """One version of an experience library: what an on-chain root and an IPFS CID commit to.

    Experiences are sorted by id (the canonical order) and ids are unique. A genesis version (whatever
    its number) has parent_root ""; later versions name the root of the version they were derived from.
    Version 0 can only be a genesis. `schema` is the format tag: "zoo.experience-library/1" for lessons
    only (exactly as before worked examples existed), "/2" once it holds an example, "/4" once it names
    its base model's weights by hash. `base_model_sha256` is left out of the document when empty (its
    default), so a library of an older format encodes, and hashes, exactly as it always did.
    """

    # Declared in the document's (sorted) key order: msgspec writes fields in this order.
    base_model: str
    base_model_sha256: str = ""
    description: str
    experiences: tuple[Experience, ...]
    parent_root: str
    schema: str
    version: int

    def __post_init__(self) -> None:
        if not 0 <= self.version <= MAX_JSON_INT:
            raise Problem("version", f"must be between 0 and 2**53 - 1 (got {self.version})")
        if self.parent_root and not ROOT_RE.fullmatch(self.parent_root):
            raise Problem("parent_root", 'must be "" (genesis) or 0x followed by 64 lower-case hex digits')
        if self.version == 0 and self.parent_root:
            raise Problem("parent_root", "version 0 cannot have a parent root")
        if not 0 < len(self.base_model) <= MAX_NAME_CHARS:
            raise Problem("base_model", f"must have 1 to {MAX_NAME_CHARS} characters")
        check_clean(self.base_model, "base_model")
        if self.base_model_sha256 and not SHA256_RE.fullmatch(self.base_model_sha256):
            raise Problem("base_model_sha256", 'must be "" or 64 lower-case hex digits (a SHA-256)')
        if len(self.description) > MAX_DESCRIPTION_CHARS:
            raise Problem("description", f"has more than {MAX_DESCRIPTION_CHARS} characters")
        check_clean(self.description, "description", multiline=True)
        experiences = self.experiences
        has_example = False
        previous = ""
        for e in experiences:
            if e.id <= previous:
                if e.id == previous:
                    raise Problem("experiences", f"experience id {e.id} occurs more than once")
                raise Problem("experiences", "must be sorted by id")
            previous = e.id
            has_example = has_example or e.kind == EXAMPLE
        schema = schema_for(experiences if has_example else (), self.base_model_sha256)
        if self.schema != schema:
            raise Problem("schema", f"must be {schema!r} for these experiences (got {self.schema[:80]!r})")

    @classmethod
    def create(
        cls,
        *,
        version: object,
        base_model: object,
        experiences: Iterable[Experience] = (),
        parent_root: object = "",
        description: object = "",
        base_model_sha256: object = "",
    ) -> Library:
        """Validate a version; experiences may come in any order (they are sorted by id). Naming the base
        model's hash (`base_model_sha256`) makes it a format-4 library."""
        p = Problems()
        if type(version) is not int:
            p.found.append(Problem("version", f"must be an integer (got {type(version).__name__})", version))
        elif not 0 <= version <= MAX_JSON_INT:
            p.found.append(Problem("version", f"must be between 0 and 2**53 - 1 (got {version})", version))
        root = p.check(_root, parent_root)
        name = p.check(as_name, base_model, "base_model")
        model_hash = p.check(_sha256, base_model_sha256)
        text = p.check(_description, description)
        ordered = tuple(sorted(experiences, key=lambda e: e.id))
        for i, e in enumerate(ordered):
            if not isinstance(e, Experience):
                p.found.append(Problem("experiences", f"item {i} is not an Experience"))
                break
            if i and ordered[i - 1].id == e.id:
                p.found.append(Problem("experiences", f"experience id {e.id} occurs more than once"))
                break
        if version == 0 and root:
            p.found.append(Problem("parent_root", "version 0 cannot have a parent root"))
        p.raise_if_any()
        schema = schema_for(ordered, model_hash or "")
        return build_struct(cls, "", base_model=name, base_model_sha256=model_hash or "", description=text,
                      experiences=ordered, parent_root=root, schema=schema, version=version)  # fmt: skip

    @classmethod
    def parse(cls, data: object) -> Library:
        """create() from a mapping whose experiences are mappings (each parsed) or Experience objects."""
        keys = {"version", "parent_root", "base_model", "base_model_sha256", "description", "experiences"}
        fields = checked_fields(data, keys, "")
        raw = fields.pop("experiences", ())
        if not isinstance(raw, list | tuple):
            raise ValidationError("experiences", "must be a list")
        parsed = []
        for i, x in enumerate(raw):
            if isinstance(x, Experience):
                parsed.append(x)
                continue
            try:
                parsed.append(Experience.parse(x))
            except ValidationError as e:
                raise ValidationError(f"experiences[{i}].{e.field}", e.message.partition(": ")[2],
                                      **e.values) from None  # fmt: skip
        fields.setdefault("version", None)
        fields.setdefault("base_model", None)
        return cls.create(**fields, experiences=parsed)

    def get(self, experience_id: str) -> Experience:
        """The experience with this id; NotFound if the library has none."""
        return self.experiences[self.index_of(experience_id)]

    def index_of(self, experience_id: str) -> int:
        """Position of the experience in canonical order, which is also its Merkle leaf index."""
        i = bisect.bisect_left(self.experiences, experience_id, key=lambda e: e.id)
        if i == len(self.experiences) or self.experiences[i].id != experience_id:
            raise NotFound(f"experience {experience_id} is not in library version {self.version}",
                           experience_id=experience_id, version=self.version)  # fmt: skip
        return i


def _root(value: object) -> str:
    if not isinstance(value, str):
        raise Problem("parent_root", f"must be a string (got {type(value).__name__})", value)
    value = value.lower()
    if value and not ROOT_RE.fullmatch(value):
        raise Problem("parent_root", 'must be "" (genesis) or 0x followed by 64 hex digits', value)
    return value


def _sha256(value: object) -> str:
    if not isinstance(value, str) or (value and not SHA256_RE.fullmatch(value)):
        raise Problem("base_model_sha256", 'must be "" or 64 lower-case hex digits (a SHA-256)', value)
    return value


def _description(value: object) -> str:
    text = clean_string(value, multiline=True, where="description")
    if len(text) > MAX_DESCRIPTION_CHARS:
        raise Problem("description", f"has {len(text)} characters; at most {MAX_DESCRIPTION_CHARS}")
    return text
