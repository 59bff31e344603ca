"""The HTTP API's request and response bodies (pydantic v2), from which FastAPI validates requests and writes the
OpenAPI schema (``GET /openapi.json``, ``/docs``).

Cohere's rerank (``POST /v1/rerank``, ``/v2/rerank``), which also takes Jina's requests (documents as ``{"text":
...}`` objects), and text-embeddings-inference's (``POST /rerank``). Unknown fields are ignored, as those servers'
clients send fields of their own (``max_chunks_per_doc``, ...). Cohere's ``model`` picks one of the models served; TEI's
request takes it too.

Both APIs take two fields of cis-distill's own: ``first_stage_scores``, the first stage's score of each document, which
fuses the student's score with it, and ``first_stage``, which names that first stage (its α in the student's card).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from distill.core.schema import text_fault


def _valid_text(text: str) -> str:
    """``text`` itself, if a tokenizer and the answer's JSON can take it
    (:func:`~distill.core.schema.text_fault`)."""
    fault = text_fault(text)
    if fault is not None:
        raise _invalid_text(fault)
    return text


def _invalid_text(fault: str) -> PydanticCustomError:
    """The validation error of text that is no text, saying ``fault`` (its braces kept: pydantic formats it)."""
    return PydanticCustomError("invalid_text", fault.replace("{", "{{").replace("}", "}}"))


def _unencodable(value: Any, where: str = "") -> str | None:
    """Where a string in a document object (a key or a value, at any depth: ``['meta']['tags'][0]``) holds a lone
    UTF-16 surrogate, and what; None where none does. The answer returns the object whole, and its JSON (UTF-8)
    could not hold that string, even in a field that is not scored."""
    if isinstance(value, str):
        fault = None if value.isascii() else text_fault(value.replace("\x00", ""))  # a NUL is fine in JSON
        return f"{where.lstrip()}: {fault}" if fault else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _unencodable(key, f"{where} key {key!r}") or _unencodable(item, f"{where}[{key!r}]")
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            if found := _unencodable(item, f"{where}[{i}]"):
                return found
    return None


def _document_text(value: Any) -> Any:
    """A document's text: the string itself, or the ``text`` of a ``{"text": ...}`` object (Cohere v1, Jina)."""
    if isinstance(value, dict):  # its text is checked as a text, below; the rest as what the answer returns
        rest = {key: item for key, item in value.items() if key != "text" or not isinstance(item, str)}
        if fault := _unencodable(rest):
            raise _invalid_text(fault)
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return value["text"]
    if not isinstance(value, str):
        raise PydanticCustomError("document", "a document is a string or an object with a string 'text'")
    return value


Document = Annotated[
    str,
    BeforeValidator(_document_text),
    AfterValidator(_valid_text),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string"},
                {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            ]
        }
    ),
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    """Fields not known are ignored (the clients' own, such as Cohere's ``max_chunks_per_doc``); known ones take
    their JSON type only (``"top_n": "1"`` or ``true`` is a 422, not 1)."""

    query: str = Field(description="The query; not empty.")
    model: str | None = Field(
        None,
        description="The model to rerank with, by the name the server gives it (--model NAME=PATH): with several "
        "served, a name not served is a 404 and none is the first; with one, any name is taken (TEI's request: "
        "cis-distill's extension).",
    )
    first_stage_scores: list[Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        None,
        description="cis-distill's extension: the first stage's score of each document, in their order; the score is "
        "then α · z(student) + (1 − α) · z(first stage), z standardising over the request's documents, with the α "
        "of the student's card for the first stage. Without it, the student's score alone.",
    )
    first_stage: str | None = Field(
        None,
        description="cis-distill's extension: the first stage of first_stage_scores (bm25, splade, ...), whose α "
        "fuses them (default: the server's --first_stage, else the student's one first stage).",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_misspelt_extension(cls, body: Any) -> Any:
        """Unknown fields are ignored, but not in cis-distill's own ``first_stage*`` names: a misspelt
        ``first_stage_score`` would rank by the student alone with a 200."""
        if isinstance(body, dict):
            for name in body:
                if isinstance(name, str) and name.startswith("first_stage") and name not in cls.model_fields:
                    raise PydanticCustomError(
                        "unknown_field", "unknown field {name}: the extension's fields are first_stage_scores and "
                        "first_stage", {"name": repr(name)}
                    )  # fmt: skip
        return body

    @field_validator("query")
    @classmethod
    def _not_blank(cls, query: str) -> str:
        if not query.strip():
            raise PydanticCustomError("empty", "must not be empty")
        return _valid_text(query)


class CohereRequest(_Request):
    """Cohere's rerank request (``/v1/rerank``, ``/v2/rerank``), which Jina's also fits."""

    documents: list[Document] = Field(
        description="The documents to score: strings, or objects with a 'text' (or the rank_fields)."
    )
    rank_fields: list[str] | None = Field(
        None,
        min_length=1,
        description="For object documents: the keys whose values are scored, as 'key: value' lines in this order "
        "(default: 'text' alone, as Cohere v1).",
    )
    objects: SkipJsonSchema[list[dict[str, Any] | None]] = Field(default_factory=list, exclude=True)
    """Each document as the request sent it where it is an object (None for a string): what ``return_documents``
    returns. Set from ``documents``, not sent."""

    @model_validator(mode="before")
    @classmethod
    def _ranked_fields(cls, body: Any) -> Any:
        """Object documents kept for ``return_documents``, and scored by their ``rank_fields``."""
        if not isinstance(body, dict) or not isinstance(body.get("documents"), list):
            return body
        documents, fields = body["documents"], body.get("rank_fields")
        body = {**body, "objects": [d if isinstance(d, dict) else None for d in documents]}
        if isinstance(fields, list) and fields and all(isinstance(f, str) for f in fields):
            texts = []
            for i, document in enumerate(documents):
                if isinstance(document, dict) and not _unencodable(document):  # else named where it is validated
                    if missing := [f for f in fields if not isinstance(document.get(f), str | int | float)]:
                        raise PydanticCustomError(
                            "rank_fields", "documents[{i}] has no rank field {field} (a string or a number)",
                            {"i": i, "field": repr(missing[0])},
                        )  # fmt: skip
                    document = "\n".join(f"{f}: {document[f]}" for f in fields)
                texts.append(document)
            body["documents"] = texts
        return body

    top_n: int | None = Field(None, ge=1, description="Return the best top_n documents (default: all).")
    return_documents: bool = Field(False, description="Return each result's document text (as Cohere v1 does).")
    max_tokens_per_doc: int | None = Field(
        None, ge=1, description="Cut each document to this many tokens (Cohere v2); at most the server's limit."
    )
    truncate: bool = Field(
        True, description="Cut documents too long for the model (as Cohere does); false: a 413 names the limit."
    )
    raw_scores: bool = Field(
        False, description="relevance_score is the model's raw score, not its calibrated probability (as Infinity's)."
    )


class CohereDocument(BaseModel):
    """A returned document: its text, or the object the request sent, whole (as Cohere v1 returns it)."""

    model_config = ConfigDict(extra="allow")
    text: str | None = None


class CohereResult(BaseModel):
    index: int = Field(description="The document's position in the request.")
    relevance_score: float = Field(description="The calibrated probability, in (0, 1); the raw score with raw_scores.")
    document: CohereDocument | None = None


class ApiVersion(BaseModel):
    version: str


class BilledUnits(BaseModel):
    search_units: int


class Tokens(BaseModel):
    input_tokens: int


class CohereMeta(BaseModel):
    api_version: ApiVersion
    billed_units: BilledUnits
    tokens: Tokens


class Usage(BaseModel):
    """Jina's and Infinity's token count."""

    prompt_tokens: int
    total_tokens: int


class CohereResponse(BaseModel):
    """Cohere's rerank response (``meta``, as Cohere's SDK reads it), with Jina's ``usage``."""

    id: str
    results: list[CohereResult] = Field(description="The best documents, best first.")
    meta: CohereMeta
    usage: Usage


class TeiRequest(_Request):
    """text-embeddings-inference's rerank request."""

    texts: list[Document] = Field(description="The documents to score (strings).")
    truncate: bool = Field(False, description="Cut texts too long for the model; false (TEI's default): a 413.")
    truncation_direction: Literal["Right", "Left", "right", "left"] = Field(
        "Right", description="Which end of a text too long is cut: Right keeps its start (TEI's default), Left its end."
    )
    raw_scores: bool = Field(False, description="The raw scores, not their calibrated probability (TEI's default).")
    return_text: bool = Field(False, description="Return each text.")


class TeiResult(BaseModel):
    index: int
    score: float = Field(description="The calibrated probability, in (0, 1); the raw score with raw_scores.")
    text: str | None = None


class ErrorBody(BaseModel):
    error: str = Field(description="What is wrong, in one line, naming the field or the limit.")
    error_type: str = Field(
        description="TEI's kind of error: validation (4xx), overloaded (429), unhealthy (503) or backend (5xx)."
    )
