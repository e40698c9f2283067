"""What the partitioner claimed, per operator, and why each declined call was declined."""

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class OperatorReport:
    delegated: int = 0
    declined: list = field(default_factory=list)  # [(node name, reason)]: left outside MLX
    decomposed: list = field(default_factory=list)  # [(node name, reason)]: fused op not kept whole
    host: list = field(default_factory=list)  # [node name]: a size read on the host, by ExecuTorch's scalar ops


@dataclass
class PartitionReport:
    """Per operator: calls MLX took, calls left to the CPU fallback, and fused calls
    (attention, roll) that MLX could not take whole and that were decomposed into
    primitives — which MLX may then take one by one."""

    operators: dict = field(default_factory=lambda: defaultdict(OperatorReport))

    def record(self, operator: str, node_name: str, reason) -> None:
        entry = self.operators[operator]
        if reason is None:
            entry.delegated += 1
        else:
            entry.declined.append((node_name, reason))

    def record_host(self, operator: str, node_name: str) -> None:
        self.operators[operator].host.append(node_name)

    def record_decomposed(self, operator: str, node_name: str, reason: str) -> None:
        self.operators[operator].decomposed.append((node_name, reason))

    @property
    def fully_delegated(self) -> bool:
        return all(not entry.declined for entry in self.operators.values())

    def _count(self, kind: str) -> int:
        return sum(len(getattr(entry, kind)) for entry in self.operators.values())

    def merge(self, other: "PartitionReport") -> None:
        for operator, entry in other.operators.items():
            mine = self.operators[operator]
            mine.delegated += entry.delegated
            mine.declined.extend(entry.declined)
            mine.decomposed.extend(entry.decomposed)
            mine.host.extend(entry.host)

    def declined_lines(self):
        for operator, entry in sorted(self.operators.items()):
            for node_name, reason in entry.declined:
                yield f"etmlx declined {operator} ({node_name}): {reason}"

    def summary(self) -> str:
        """One line: what a user must know even without asking for the report."""
        decomposed = self._count("decomposed")
        note = f"; {decomposed} fused call(s) decomposed first (--report says why)" if decomposed else ""
        if self.fully_delegated:
            total = sum(e.delegated for e in self.operators.values())
            return f"etmlx: all {total} operator calls delegated to MLX{note}"
        declined = sorted(op for op, e in self.operators.items() if e.declined)
        return (
            f"etmlx: {self._count('declined')} operator call(s) not delegated to MLX and run on the "
            f"CPU fallback: {', '.join(declined)} (etmlx export --report for reasons){note}"
        )

    def to_text(self) -> str:
        lines = [f"{'operator':<48} {'delegated':>9} {'declined':>8} {'decomposed':>10}"]
        for operator in sorted(self.operators):
            entry = self.operators[operator]
            lines.append(
                f"{operator:<48} {entry.delegated:>9} {len(entry.declined):>8} {len(entry.decomposed):>10}"
            )
            for kind in ("declined", "decomposed"):
                for node_name, reason in getattr(entry, kind):
                    lines.append(f"    {node_name} ({kind}): {reason}")
            for node_name in entry.host:
                lines.append(f"    {node_name} (host): a size read from a tensor's value by ExecuTorch's scalar ops")
        return "\n".join(lines)
