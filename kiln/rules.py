"""One shape for every rewrite decision: match, then check (a reason or go), then rewrite — traced.

TF-level legalisation patterns, composite and loop fusions, the routing of Keras layers and the
IR passes all decide "rewrite this here, or not, and why". They share `Rule` and report each
decision to a `Tracer`, so the conversion report carries structured `Decision`s (stage, subject,
rule, fired, reason) that a user or a test can filter, instead of sentences to split.

Only `Decline` means "this rule does not apply here, for this reason". Any other exception raised
inside a rule (TypeError, KeyError, IndexError, AttributeError ...) is a bug in the rule and
propagates: turning it into "not fused" would hide it behind a slower, still-correct model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, TypeVar

from .errors import KilnError

Site = TypeVar("Site")
Match = TypeVar("Match")

#: Stages a decision can come from (ConversionReport.decisions groups by these); "backend":
#: whether a backend (a delegate, XLA) runs a node, and why not (kiln.ops.backends).
STAGES = ("keras", "legalize", "fusion", "pass", "backend")


@dataclass(frozen=True)
class Decision:
    """One rule's verdict on one subject.

    Attributes:
      stage: where the rule runs ("keras", "legalize", "fusion", "pass", "backend").
      subject: what the rule looked at, as users know it (a Keras layer, a function, an op).
      rule: the rule's name ("fuse-activations", an implements name, "keras3_lstm_loop", ...).
      fired: whether it rewrote (stage "backend": whether the backend runs the node).
      detail: when it fired, the sentence users read, subject included ("lstm: fused into
        UNIDIRECTIONAL_SEQUENCE_LSTM"); when it did not, the reason alone.
    """

    stage: str
    subject: str
    rule: str
    fired: bool
    detail: str = ""

    def to_dict(self) -> dict:
        """The decision as JSON-ready data: ``reason`` when it declined, ``result`` when it fired."""
        return {"stage": self.stage, "subject": self.subject, "rule": self.rule, "fired": self.fired,
                "reason": None if self.fired else self.detail,
                "result": (self.detail or None) if self.fired else None}

    def __str__(self) -> str:
        if self.stage == "backend":
            return f"{self.subject}: {'run' if self.fired else 'not run'} by {self.rule}" + \
                (f": {self.detail}" if self.detail else "")
        if self.fired:
            return self.detail or f"{self.subject}: rewritten by {self.rule}"
        verb = "not fused" if self.stage in ("keras", "fusion") else f"not rewritten by {self.rule}"
        return f"{self.subject}: {verb}: {self.detail}"


class Decline(KilnError):
    """A rule's check failed: it does not apply to ``subject`` because of ``reason``.

    ``str()`` is the sentence users read ("lstm_2: not fused: the layer has a mask").
    """

    def __init__(self, reason: str, subject: str | None = None):
        self.reason = reason
        self.subject = subject
        super().__init__(f"{subject}: not fused: {reason}" if subject else reason)


class Tracer:
    """Collects decisions; a later decision on the same (stage, subject, rule) replaces the
    earlier one, since passes run to a fixed point and a rule may fire in a later round."""

    def __init__(self) -> None:
        self._decisions: dict[tuple[str, str, str], Decision] = {}

    def record(self, decision: Decision) -> Decision:
        key = (decision.stage, decision.subject, decision.rule)
        self._decisions.pop(key, None)   # re-inserted last: decisions stay in the order they settled
        self._decisions[key] = decision
        return decision

    def fired(self, stage: str, subject: str, rule: str, detail: str = "") -> Decision:
        return self.record(Decision(stage, subject, rule, True, detail))

    def declined(self, stage: str, subject: str, rule: str, reason: str) -> Decision:
        return self.record(Decision(stage, subject, rule, False, reason))

    def retract(self, keep: Callable[[Decision], bool]) -> None:
        """Drop the decisions ``keep`` rejects (a later rewrite superseded them, e.g. two fused
        LSTM directions merged into one bidirectional op)."""
        self._decisions = {k: d for k, d in self._decisions.items() if keep(d)}

    @property
    def decisions(self) -> list[Decision]:
        return list(self._decisions.values())

    def extend(self, decisions: Iterable[Decision]) -> None:
        for d in decisions:
            self.record(d)


class NullTracer(Tracer):
    """A tracer that forgets: rules applied outside a conversion (a pass run alone) report here."""

    def record(self, decision: Decision) -> Decision:
        return decision


@dataclass(frozen=True)
class Rule(Generic[Site, Match]):
    """match → check → rewrite, with the decision traced.

    Attributes:
      name: the rule's name in decisions.
      stage: see `STAGES`.
      match: ``site -> match`` or None when the rule has nothing to look at here (silent: no
        decision is recorded for sites a rule does not even concern).
      rewrite: ``match -> result`` (truthy); it may still raise `Decline` before changing anything.
      check: ``match -> reason`` the rule must not fire, or None to go ahead.
      subject: ``match -> str``, what the decision is about.
      detail: ``match -> str``, the sentence users read when it fires (subject included); taken
        before the rewrite, while the sites it names still exist.
      outcome: ``(match, result) -> str``, the sentence taken *after* the rewrite instead, for
        rules whose rewrite says what it made (a fusion's report lines).

    A `Decline` raised by the rewrite may name a more precise subject than ``subject`` gives
    (``Decline(reason, subject)``); the decision then is about that one.
    """

    name: str
    stage: str
    match: Callable[[Site], Match | None]
    rewrite: Callable[[Match], Any]
    check: Callable[[Match], str | None] = lambda m: None
    subject: Callable[[Match], str] = str
    detail: Callable[[Match], str] | None = None
    outcome: Callable[[Match, Any], str] | None = None

    def apply(self, site: Site, tracer: Tracer) -> Any:
        """The rewrite's result when the rule fired, else None (the decision is in ``tracer``)."""
        m = self.match(site)
        if m is None:
            return None
        subject = self.subject(m)
        reason = self.check(m)
        if reason is None:
            detail = self.detail(m) if self.detail else ""
            try:
                result = self.rewrite(m)
            except Decline as exc:
                reason, subject = exc.reason, exc.subject or subject
            else:
                if result:
                    if self.outcome is not None:
                        detail = self.outcome(m, result)
                    tracer.fired(self.stage, subject, self.name, detail)
                    return result
                reason = "the rewrite found nothing to change"
        tracer.declined(self.stage, subject, self.name, reason)
        return None
