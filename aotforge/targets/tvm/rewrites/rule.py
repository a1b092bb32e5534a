"""What every Relax rewrite rule of the ``tvm`` target is, and the one walk that applies them.

A rule, like a rule of onnxscript's rewriter, has three parts: ``matches`` (the cheap pattern:
is this a call the rule is about), ``check`` (the conditions: a :class:`MatchResult` that
carries what ``rewrite`` needs, or fails with the reason it does not apply) and ``rewrite``
(the replacement). :func:`apply_rules` counts what each rule rewrote and why each matched call
was left alone; the passes turn those counts into the manifest's report.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from aotforge.targets.tvm.relax_util import relax_functions, rewrite_functions

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class MatchResult(Generic[T]):
    """A rule's check: ``value`` for its rewrite when it matched, else the ``reason`` it did not."""

    value: T | None = None
    reason: str = ""

    @classmethod
    def fail(cls, reason: str) -> MatchResult[Any]:
        return cls(None, reason)

    def __bool__(self) -> bool:
        return not self.reason


class Rewriter(Protocol):
    """What a rule sees of the walk: the block builder and a var's bound expression."""

    builder_: Any

    def bound(self, expr: Any) -> Any: ...

    def add_kernel(self, name: str, make: Callable[[], Any]) -> Any:
        """The global var of PrimFunc ``name``, made and added to the module the first time."""
        ...


class Rule:
    """A rewrite rule; subclasses set ``name`` and define ``matches`` and ``rewrite``."""

    #: the key the rule's count goes under in the pass's report
    name: str = ""

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        """Whether ``call`` is one this rule is about (``bound`` resolves a var to its value)."""
        raise NotImplementedError

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        """What ``rewrite`` needs from a matched ``call``, or why it cannot be rewritten."""
        return MatchResult()

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        raise NotImplementedError


@dataclasses.dataclass
class RewriteStats:
    """What one walk did: rewrites per rule name, skips per reason, PrimFuncs it added."""

    applied: Counter[str] = dataclasses.field(default_factory=Counter)
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)
    kernels: int = 0


def apply_rules(mod: Any, rules: Sequence[Rule]) -> tuple[Any, RewriteStats]:
    """``mod`` with every call the first matching rule accepts rewritten (inner calls first)."""
    from tvm import relax
    from tvm.relax import PyExprMutator, expr_functor

    stats = RewriteStats()
    kernels: dict[str, Any] = {}

    @expr_functor.mutator
    class _Mutator(PyExprMutator):  # type: ignore[misc]
        def bound(self, expr: Any) -> Any:
            return self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr

        def add_kernel(self, name: str, make: Callable[[], Any]) -> Any:
            if name not in kernels:
                kernels[name] = self.builder_.add_func(make().with_attr("global_symbol", name), name)
            return kernels[name]

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            rule = next((r for r in rules if r.matches(call, self.bound)), None)
            if rule is None:
                return call
            match = rule.check(call, self)
            if not match:
                stats.skipped[match.reason] += 1
                return call
            stats.applied[rule.name] += 1
            return rule.rewrite(call, match.value, self)

    mod = rewrite_functions(_Mutator, mod)
    stats.kernels = len(kernels)
    return mod, stats


def count_matches(mod: Any, rules: Sequence[Rule]) -> int:
    """How many calls of ``mod``'s Relax functions some rule ``matches`` (nothing rewritten)."""
    from tvm import relax

    count = 0
    for _, func in relax_functions(mod):
        bindings = relax.analysis.get_var2val(func)

        def visit(expr: Any, bindings: Any = bindings) -> None:
            nonlocal count
            count += any(r.matches(expr, lambda v: bindings.get(v, v)) for r in rules)

        relax.analysis.post_order_visit(func, visit)
    return count
