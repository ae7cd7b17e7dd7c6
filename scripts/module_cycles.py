#!/usr/bin/env python3
"""Import circles between the modules (files) of each crate's src/.

A module imports another when its code names an item of it: a `use`, or a
path written inline (`super::task::Task`). A name another module re-exports
(`pub use task::Task` in runtime/mod.rs) counts as an import of the module
that defines it, so a parent that only gathers its children's items is not
a circle. Test modules (`#[cfg(test)] mod tests { .. }`) are left out.

The circles found are compared with scripts/module-cycles.txt, the ones
known today (one line per circle, its modules sorted): a circle that is not
inside a known one, or a known one that grew, fails the check, so new
circles cannot come in while the known ones are taken apart (issue 46).
A known circle that shrank or went is reported, and `--write` records the
smaller list.

    scripts/module_cycles.py            check (exit 1 on a new circle)
    scripts/module_cycles.py --write    rewrite scripts/module-cycles.txt
    scripts/module_cycles.py --edges    also print why each circle exists
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KNOWN = ROOT / "scripts" / "module-cycles.txt"
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def crate_dirs():
    """Every `src/` of the workspace's crates (a Cargo.toml beside it)."""
    dirs = []
    for manifest in sorted(ROOT.glob("**/Cargo.toml")):
        if any(part in ("target", "fuzz") or part.startswith(".") for part in manifest.parts):
            continue
        src = manifest.parent / "src"
        if src.is_dir():
            dirs.append(src)
    return dirs


def module_files(src):
    """Module path (`crate::a::b`) -> file."""
    modules = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts in (["lib"], ["main"]):
            parts = []
        elif parts[-1] == "mod":
            parts = parts[:-1]
        elif len(parts) == 1 and parts[0] in ("main",):
            parts = []
        if "bin" in rel.parts[:1]:
            continue  # binaries are crates of their own
        modules["::".join(["crate"] + parts)] = path
    return modules


def strip_code(text):
    """The code without comments, string and char literals, and test modules."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\])'", "' '", text)
    while True:
        found = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{", text)
        if not found:
            return text
        depth, end = 0, found.end() - 1
        for end in range(found.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = text[: found.start()] + text[end + 1 :]


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (each as a segment list)."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree))
    brace = tree.find("{")
    if brace < 0:
        return [tree]
    prefix, body = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    out = []
    for part in filter(None, parts):
        for tail in expand_use(part):
            out.append(prefix + tail if tail != "self" else prefix.rstrip(":"))
    return out


def absolute(path, module, modules):
    """`super::x` in `crate::a::b` -> `crate::a::x`; `self::x` and `child::x`
    (a module declared in this one) -> `crate::a::b::x`."""
    segments = path.split("::")
    base = module.split("::")
    if segments[0] == "crate":
        return segments
    if module + "::" + segments[0] in modules:
        return base + segments
    if segments[0] == "self":
        return base + segments[1:]
    if segments[0] == "super":
        while segments and segments[0] == "super":
            base = base[:-1] if len(base) > 1 else base
            segments = segments[1:]
        return base + segments
    return None  # another crate, or a name in scope


def parse(modules):
    """Per module: its re-exports (name -> absolute path) and the paths it names."""
    info = {}
    for module, path in modules.items():
        code = strip_code(path.read_text())
        reexports, named = {}, []
        for found in re.finditer(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", code):
            for full in expand_use(found.group(2)):
                full_path, _, alias = full.partition("@")
                segments = absolute(full_path, module, modules)
                if found.group(1) and not full_path.endswith("*"):
                    # A re-export gathers, it does not import: followed by
                    # the modules that name it. None: another crate's item.
                    reexports[alias or full_path.split("::")[-1]] = segments
                elif segments is not None:
                    named.append(segments)
        for found in re.finditer(r"\b(?:crate|super|self)(?:::(?:" + IDENT + r"))+", code):
            segments = absolute(found.group(0), module, modules)
            if segments:
                named.append(segments)
        info[module] = (reexports, named)
    return info


def resolve(segments, modules, info, seen=None):
    """The module defining the item a path names (re-exports followed)."""
    seen = seen or set()
    for cut in range(len(segments), 0, -1):
        target = "::".join(segments[:cut])
        if target in modules:
            rest = segments[cut:]
            if rest and rest[0] != "*" and (target, rest[0]) not in seen:
                exports = info[target][0]
                if rest[0] in exports:
                    origin = exports[rest[0]]
                    if origin is None:
                        return None  # re-exported from another crate
                    seen.add((target, rest[0]))
                    return resolve(origin + rest[1:], modules, info, seen)
            return target
    return None


def graph(src):
    modules = module_files(src)
    info = parse(modules)
    edges = {module: {} for module in modules}
    for module, (_, named) in info.items():
        for segments in named:
            target = resolve(segments, modules, info)
            if target and target != module:
                edges[module].setdefault(target, "::".join(segments))
    return edges


def circles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def main():
    write, show_edges = "--write" in sys.argv, "--edges" in sys.argv
    found = []
    for src in crate_dirs():
        crate = str(src.parent.relative_to(ROOT)) or "."
        edges = graph(src)
        for component in circles(edges):
            line = crate + ": " + " ".join(component)
            found.append(line)
            if show_edges:
                print(line)
                for module in component:
                    for target, via in sorted(edges[module].items()):
                        if target in component:
                            print(f"    {module} -> {target}   ({via})")
    found.sort()
    if write:
        header = (
            "# Import circles between modules known today (scripts/module_cycles.py):\n"
            "# one may shrink, none may grow or be added. Rewritten by --write.\n"
        )
        KNOWN.write_text(header + "".join(line + "\n" for line in found))
        print(f"module_cycles: {len(found)} circles written to {KNOWN.relative_to(ROOT)}")
        return 0
    known = [line.strip() for line in KNOWN.read_text().splitlines()] if KNOWN.exists() else []
    known = [line for line in known if line and not line.startswith("#")]

    def members(line):
        crate, names = line.split(": ", 1)
        return crate, set(names.split())

    new = []
    for line in found:
        crate, names = members(line)
        if not any(c == crate and names <= k for c, k in map(members, known)):
            new.append(line)
    smaller = [line for line in known if line not in found]
    for line in new:
        print(f"module_cycles: a new import circle (or a known one grew): {line}")
    if smaller and not new:
        print("module_cycles: known circles shrank or went; record it with scripts/module_cycles.py --write")
    sizes = sum(len(line.split(": ", 1)[1].split()) for line in found)
    print(f"module_cycles: {len(found)} circles over {sizes} modules, {len(new)} new")
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
