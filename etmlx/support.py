"""The support table (``etmlx ops``): every operator of PyTorch's core ATen opset, and
whether its calls are delegated to MLX, read from the lowering rules themselves."""

import inspect


def core_aten_operators() -> list:
    """Names (``aten::add.Tensor``) of the operators torch tags ``core``: what remains
    of a program after ExecuTorch's decompositions."""
    import torch

    names = []
    for attribute in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, attribute, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags:
                schema = op._schema
                names.append(f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name)
    return sorted(names)


def _rule_for(name: str, rules: dict):
    """The rule for a core operator: ExecuTorch's edge dialect replaces views by copies
    (``aten::permute`` reaches lowering as ``aten::permute_copy``)."""
    if name in rules:
        return rules[name]
    base, _, overload = name.partition(".")
    return rules.get(f"{base}_copy" + (f".{overload}" if overload else ""))


def _conditions(check) -> str:
    """Where a rule's check lives, and its first docstring line when it has one."""
    module = check.__module__.replace("etmlx.lowering.", "lowering/").replace(".", "/") + ".py"
    doc = (inspect.getdoc(check) or "").split("\n")[0]
    return f"{module}:{check.__name__}" + (f" ({doc})" if doc else "")


def support_table() -> list:
    """One row per core ATen operator: ``{"operator", "status", "conditions"}``, status
    ``delegated`` (every call), ``checked`` (calls the rule's check accepts; the others
    stay on ExecuTorch's kernels, or decompose first) or ``not covered``."""
    import etmlx.lowering.rules  # noqa: F401  (registers every rule)
    from etmlx.lowering.registry import RULES, accept

    rows = []
    for name in core_aten_operators():
        rule = _rule_for(name, RULES)
        if rule is None:
            rows.append({"operator": name, "status": "not covered", "conditions": ""})
        elif rule.check is accept:
            rows.append({"operator": name, "status": "delegated", "conditions": ""})
        else:
            rows.append({"operator": name, "status": "checked", "conditions": _conditions(rule.check)})
    return rows


def summary(rows: list) -> str:
    covered = sum(row["status"] != "not covered" for row in rows)
    checked = sum(row["status"] == "checked" for row in rows)
    return (f"{covered} of {len(rows)} core ATen operators ({100 * covered / len(rows):.0f}%) have an MLX rule; "
            f"{checked} of those delegate the calls their check accepts")


def format_text(rows: list) -> str:
    width = max(len(row["operator"]) for row in rows)
    lines = [f"{row['operator']:<{width}}  {row['status']:<11}  {row['conditions']}".rstrip() for row in rows]
    return "\n".join(lines + [summary(rows)])
