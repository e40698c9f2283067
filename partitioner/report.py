"""What the partitioner claimed, per operator, and why each declined call was declined."""

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class OperatorReport:
    delegated: int = 0
    declined: list = field(default_factory=list)  # [(node name, reason)]


@dataclass
class PartitionReport:
    operators: dict = field(default_factory=lambda: defaultdict(OperatorReport))

    def record(self, operator: str, node_name: str, reason) -> None:
        entry = self.operators[operator]
        if reason is None:
            entry.delegated += 1
        else:
            entry.declined.append((node_name, reason))

    @property
    def fully_delegated(self) -> bool:
        return all(not entry.declined for entry in self.operators.values())

    def declined_calls(self) -> int:
        return sum(len(entry.declined) for entry in self.operators.values())

    def merge(self, other: "PartitionReport") -> None:
        for operator, entry in other.operators.items():
            mine = self.operators[operator]
            mine.delegated += entry.delegated
            mine.declined.extend(entry.declined)

    def declined_lines(self):
        for operator, entry in sorted(self.operators.items()):
            for node_name, reason in entry.declined:
                yield f"etmlx declined {operator} ({node_name}): {reason}"

    def summary(self) -> str:
        """One line: what a user must know even without asking for the report."""
        if self.fully_delegated:
            total = sum(e.delegated for e in self.operators.values())
            return f"etmlx: all {total} operator calls delegated to MLX"
        declined = sorted(op for op, e in self.operators.items() if e.declined)
        return (
            f"etmlx: {self.declined_calls()} operator call(s) not delegated to MLX and run on the "
            f"CPU fallback: {', '.join(declined)} (etmlx export --report for reasons)"
        )

    def to_text(self) -> str:
        lines = [f"{'operator':<48} {'delegated':>9} {'declined':>8}"]
        for operator in sorted(self.operators):
            entry = self.operators[operator]
            lines.append(f"{operator:<48} {entry.delegated:>9} {len(entry.declined):>8}")
            for node_name, reason in entry.declined:
                lines.append(f"    {node_name}: {reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            op: {"delegated": e.delegated, "declined": [{"node": n, "reason": r} for n, r in e.declined]}
            for op, e in sorted(self.operators.items())
        }
