"""The student card: what a student was trained on and how to use it, in ``config.cis_distill`` of its
Hugging Face folder (so it travels with the weights through ``save_pretrained``, export and the hub)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from distill.core.files import read_json_object
from distill.core.run_folder import MODEL_CONFIG
from distill.core.schema import InputError, MissingFileError

CONFIG_KEY = "cis_distill"
DEFAULT_FIRST_STAGE = "first_stage"
"""The name of the one first stage of a student validated without named first stages (and of a card's single α
written before α was kept per first stage)."""
ALPHA_KEYS = {"alpha", "chosen_on", "queries", "taken_from", "declared"}
"""The keys of a first stage's entry in :attr:`StudentCard.interpolation`."""


@dataclass
class StudentCard:
    """A distilled student's metadata. Paths are as the training command was given them."""

    backbone: str
    """The encoder it was initialised from."""
    label: str | dict[str, str]
    """The label it learned, as given: a teacher score, a hybrid or a sum of z-scores
    (``z(gemma.cis) + z(smollm2.cis_q) + 0.25*z(first_stage)``; see :mod:`distill.data.labels`), or first stage ->
    the label its lists learned."""
    loss: str
    teacher_data: list[str]
    """The teacher datasets it learned from (every folder of every teacher the label uses)."""
    target_scaling: dict[str, Any]
    """How the label was standardised (``kind``, ``mean``, ``std``): see ``students.scaling``."""
    max_length: int
    """The longest (query, passage) pair in tokens in training."""
    val_queries: list[str]
    """The held-out query ids it was validated (and its settings chosen) on."""
    qrels: str | list[str] | None = None
    """The qrels that judged its validation queries (``data.qrels``: a file, an ``irds:`` id, or a list of these);
    None: validated without (or not recorded)."""
    monitor: str | None = None
    """The validation metric that picked the best checkpoint."""
    best_score: float | None = None
    checkpoint: str | None = None
    """The checkpoint these weights come from, relative to the run folder."""
    interpolation: dict[str, dict[str, Any]] | float | None = None
    """α of ``α · z(student) + (1 − α) · z(first stage)`` for each first stage: name -> ``{"alpha": ...,
    "chosen_on": the candidate files of its validation lists, "queries": the judged validation queries it was chosen
    on}``, or, for a first stage without validation lists, ``{"alpha": ..., "taken_from": the first stage whose α it
    takes}`` or ``{"alpha": ..., "declared": true}`` (a number given in the config). A single number (cards written
    before α was kept per first stage) reads as the α of :data:`DEFAULT_FIRST_STAGE`. None: not chosen."""
    interpolate: bool = False
    """Whether rerankers apply ``interpolation`` by default (they always can when asked)."""
    teachers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """The named teachers the label uses: name -> its folders, each ``{"path": ..., "teacher": ...}`` with the
    teacher identity of the folder's ``teacher.json``; empty for one unnamed teacher (and in cards written
    before teachers had names)."""
    initial_weight_share: float = 0.0
    """The share of the backbone's initial weights blended into the trained ones (WiSE-FT); 0: as trained."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping (validation metrics at the best checkpoint, ...)."""

    def __post_init__(self) -> None:
        if isinstance(self.interpolation, (int, float)) and not isinstance(self.interpolation, bool):
            self.interpolation = {DEFAULT_FIRST_STAGE: {"alpha": float(self.interpolation)}}
        for name, entry in (self.interpolation or {}).items():
            alpha = entry.get("alpha") if isinstance(entry, dict) else None
            if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 <= alpha <= 1:
                raise InputError(f"interpolation: {name}: expected {{'alpha': a number in [0, 1], ...}}, not {entry!r}")
            if unknown := sorted(set(entry) - ALPHA_KEYS):
                raise InputError(f"interpolation: {name}: unknown key(s) {unknown}")

    def alphas(self) -> dict[str, float]:
        """The α of each first stage (empty: none chosen)."""
        return {name: float(entry["alpha"]) for name, entry in (self.interpolation or {}).items()}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str) -> StudentCard:
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(values) - known):
            raise InputError(f"{where}: {CONFIG_KEY}: unknown key(s) {unknown}")
        try:
            return cls(**values)
        except (TypeError, InputError) as e:
            raise InputError(f"{where}: {CONFIG_KEY}: {e}") from None

    @classmethod
    def read(cls, folder: str | Path) -> StudentCard:
        """The card in a student's model folder (its ``config.json``).

        Raises:
            MissingFileError: no ``config.json``; InputError: it has no (valid) card.
        """
        config = Path(folder) / MODEL_CONFIG
        if not config.is_file():
            raise MissingFileError(f"{folder}: no student here (no {MODEL_CONFIG})")
        values = read_json_object(config).get(CONFIG_KEY)
        if not values:
            raise InputError(f"{config}: no {CONFIG_KEY} card (not a cis-distill student)")
        return cls.from_dict(values, str(config))

    @classmethod
    def find(cls, folder: str | Path) -> StudentCard | None:
        """The card of a model folder, or None where it has none (a model not trained by cis-distill)."""
        config = Path(folder) / MODEL_CONFIG
        if not config.is_file() or not read_json_object(config).get(CONFIG_KEY):
            return None
        return cls.read(folder)

    def write_to(self, model_config: Any) -> None:
        """Put the card on a ``transformers`` config, for ``save_pretrained``."""
        setattr(model_config, CONFIG_KEY, self.to_dict())


def held_out_queries(student: str | Path) -> set[str]:
    """The query ids a student was validated on, from its card; ``student`` is a training run or model folder."""
    from distill.core.run_folder import student_folder

    return set(StudentCard.read(student_folder(student, exported=False)).val_queries)
