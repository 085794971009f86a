"""Readable lens expressions and string diagrams.

- `expression(lens)`: the lens as a term in ≫ and ⊗, with its type and parameter object.
- `diagram(lens)`: a string diagram as text (Unicode box drawing).
- `draw(lens, ax=None, backward=False)`: the same string diagram as a matplotlib figure.
- `svg(lens)`: that figure as SVG text (what a lens shows in a notebook, `_repr_svg_`).

Every kind of lens gives its piece of the picture (`lens.picture()`, a `lenses.picture`
term); both renderings come from one layout of that term on an integer grid: a chain goes
left to right, a parallel product is stacked, a reparameterisation, a checkpoint or a
`repeat` is a dashed frame, `copy`/`add`/`discard` are nodes (copies are explicit), every
other lens is a box. Wires are labelled with their spaces; a lens with parameters gets a
parameter wire from above labelled with its parameter object (none for R^0, whose point is
`None`: the terminal object is no wire at all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from categories import Product
from categories.numbers import flag, real_number

from .. import picture
from categories.errors import KindError, UnsupportedError

# -- expressions ------------------------------------------------------------------------------


def _has_params(space) -> bool:
    return space is not None and space.size > 0


def expression(lens, types: bool = True) -> str:
    """The lens as a term in ≫ (then) and ⊗ (parallel); with `types`, its type, its
    parameter object and the type of each component.

    Examples:
        >>> print(expression(dense(2, 3) >> tanh >> dense(3, 1), types=False))
        dense(2→3) ≫ tanh ≫ dense(3→1)
    """
    picture.need_drawable(lens, "expression")
    term = lens.term()
    if not flag(types, "expression: types"):
        return term
    lines = [f"{term} : {lens.type_str()}"]
    if lens.is_fixed():
        lines.append(f"  parameters P = {lens.param!r}")
    seen = set()
    for atom in lens.atoms():
        row = f"{atom.name} : {atom.type_str()}"
        if atom.is_fixed() and _has_params(atom.param):
            row += f", params {atom.param!r}"
        if row not in seen:
            seen.add(row)
            lines.append("  " + ("where " if len(seen) == 1 else "      ") + row)
    return "\n".join(lines)


# -- layout on a grid (x to the right, y downwards) -------------------------------------------

@dataclass(frozen=True)
class Box:
    x0: int
    y0: int
    x1: int
    y1: int
    name: str
    name_y: int


@dataclass(frozen=True)
class Node:
    x: int
    y: int
    name: str


@dataclass(frozen=True)
class Wire:
    points: tuple  # ((x, y), ...), consecutive points on a row or a column
    kind: str = "data"  # "data" or "param"


@dataclass(frozen=True)
class Text:
    x: int
    y: int
    s: str
    kind: str = "label"  # "label" (a wire's space), "param", "name", "title"


@dataclass(frozen=True)
class Frame:
    x0: int
    y0: int
    x1: int
    y1: int
    title: str


def _moved(item, dx, dy):
    if isinstance(item, Wire):
        return Wire(tuple((x + dx, y + dy) for x, y in item.points), item.kind)
    if isinstance(item, (Box, Frame)):
        extra = {"name_y": item.name_y + dy} if isinstance(item, Box) else {}
        return replace(item, x0=item.x0 + dx, x1=item.x1 + dx, y0=item.y0 + dy, y1=item.y1 + dy, **extra)
    return replace(item, x=item.x + dx, y=item.y + dy)


@dataclass
class Layout:
    """A piece of diagram: size, port rows (inputs at x = 0, outputs at x = w − 1), the
    spaces of its port wires, and what is drawn."""

    w: int
    h: int
    ins: list
    outs: list
    in_labels: list
    out_labels: list
    items: list = field(default_factory=list)

    def moved(self, dx: int, dy: int) -> "Layout":
        return Layout(self.w, self.h, [r + dy for r in self.ins], [r + dy for r in self.outs],
                      self.in_labels, self.out_labels, [_moved(i, dx, dy) for i in self.items])


def _wire_labels(space) -> list:
    """One wire per factor of a (nested) product; none for R^0."""
    if space is None:
        return ["?"]
    if isinstance(space, Product):
        return [w for f in space.factors for w in _wire_labels(f)]
    return [] if space.size == 0 else [repr(space)]


def _port_rows(k: int, first: int, rows: int) -> list:
    start = first + (rows - (2 * k - 1)) // 2
    return [start + 2 * i for i in range(k)]


def _box(name: str, ins: list, outs: list, param: str | None) -> Layout:
    n = max(len(ins), len(outs), 1)
    inner_h = 2 * n - 1
    bw = len(name) + 4
    top = 2 if param else 0
    w = max(bw + 2, (len(param) + 2) if param else 0)
    x0 = (w - bw) // 2
    x1, y0 = x0 + bw - 1, top
    y1 = y0 + inner_h + 1
    items: list = [Box(x0, y0, x1, y1, name, y0 + 1 + (inner_h - 1) // 2)]
    rin, rout = _port_rows(len(ins), y0 + 1, inner_h), _port_rows(len(outs), y0 + 1, inner_h)
    items += [Wire(((0, r), (x0, r))) for r in rin]
    items += [Wire(((x1, r), (w - 1, r))) for r in rout]
    if param:
        cx = (x0 + x1) // 2
        items += [Text(max(0, cx - len(param) // 2), 0, param, "param"), Wire(((cx, 1), (cx, y0)), "param")]
    return Layout(w, y1 + 1, rin, rout, list(ins), list(outs), items)


def _node(name: str, ins: list, outs: list) -> Layout:
    k = max(len(ins), len(outs), 1)
    sx = max(2, (len(name) + 1) // 2)
    w = max(sx + 3, len(name))
    rin, rout = _port_rows(len(ins), 1, 2 * k - 1), _port_rows(len(outs), 1, 2 * k - 1)
    rows = rin + rout
    items: list = [Text(sx - len(name) // 2, 0, name, "name")] if name else []
    if rows and max(rows) > min(rows):
        items.append(Wire(((sx, min(rows)), (sx, max(rows)))))
    items += [Wire(((0, r), (sx, r))) for r in rin]
    items += [Wire(((sx, r), (w - 1, r))) for r in rout]
    items.append(Node(sx, (min(rows) + max(rows)) // 2 if rows else 1, name))
    return Layout(w, 2 * k, rin, rout, list(ins), list(outs), items)


def _extend(lay: Layout, w: int) -> Layout:
    """Centre `lay` in width w, extending its port wires to the new edges."""
    if lay.w >= w:
        return lay
    dx = (w - lay.w) // 2
    out = lay.moved(dx, 0)
    out.w = w
    if dx:
        out.items += [Wire(((0, r), (dx, r))) for r in out.ins]
    if dx + lay.w < w:
        out.items += [Wire(((dx + lay.w - 1, r), (w - 1, r))) for r in out.outs]
    return out


def _vstack(a: Layout, b: Layout) -> Layout:
    w = max(a.w, b.w)
    a, b = _extend(a, w), _extend(b, w).moved(0, a.h + 1)
    return Layout(w, b.h + a.h + 1, a.ins + b.ins, a.outs + b.outs, a.in_labels + b.in_labels,
                  a.out_labels + b.out_labels, a.items + b.items)


def _hcat(left: Layout, right: Layout, labelled: bool = True) -> Layout:
    """`left` then `right`: the i-th output wire of left becomes the i-th input of right."""
    if len(left.outs) != len(right.ins):  # regroup through a node rather than fail to draw
        left = _hcat(left, _node("", left.out_labels, right.in_labels), labelled)
    k = len(left.outs)
    d = round(sum(left.outs) / k - sum(right.ins) / k) if k else 0
    dl, dr = max(0, -d), max(0, d)
    r = [y + dl for y in left.outs]
    s = [y + dr for y in right.ins]
    labels = [f" {lab} " for lab in left.out_labels] if labelled else [""] * k
    base = 1 + max([len(lab) for lab in labels] + [0]) + 1
    # Wires moving up turn in top-to-bottom order, wires moving down in bottom-to-top order:
    # with a column each, no two wires cross.
    up = [i for i in range(k) if s[i] < r[i]]
    down = [i for i in range(k) if s[i] > r[i]][::-1]
    col = {i: base + j for j, i in enumerate(up + down)}
    gap = base + len(col) + 1
    xl = left.w - 1
    xr = xl + gap
    items = left.moved(0, dl).items + right.moved(xr, dr).items
    for i in range(k):
        if i in col:
            c = xl + col[i]
            items.append(Wire(((xl, r[i]), (c, r[i]), (c, s[i]), (xr, s[i]))))
        else:
            items.append(Wire(((xl, r[i]), (xr, s[i]))))
        if labels[i]:
            items.append(Text(xl + 1, r[i], labels[i]))
    return Layout(xr + right.w, max(left.h + dl, right.h + dr), [y + dl for y in left.ins],
                  [y + dr for y in right.outs], left.in_labels, right.out_labels, items)


def _frame(inner: Layout, title: str, param: str | None = None) -> Layout:
    inner = _extend(inner, max(inner.w, len(title) + 4, len(param or "")))
    top = 2 if param else 0
    w = inner.w + 4
    body = inner.moved(2, top + 1)
    y1 = top + inner.h + 1
    items = [Frame(1, top, w - 2, y1, title), Text(3, y1, f" {title} ", "title")] + body.items
    items += [Wire(((0, r), (2, r))) for r in body.ins]
    items += [Wire(((w - 3, r), (w - 1, r))) for r in body.outs]
    if param:
        cx = w // 2
        items += [Text(max(0, cx - len(param) // 2), 0, param, "param"), Wire(((cx, 1), (cx, top)), "param")]
    return Layout(w, y1 + 1, body.ins, body.outs, inner.in_labels, inner.out_labels, items)


def _piece(pic: picture.Picture) -> Layout:
    """The grid layout of a picture term."""
    if isinstance(pic, picture.Then):
        out = _piece(pic.parts[0])
        for part in pic.parts[1:]:
            out = _hcat(out, _piece(part))
        return out
    if isinstance(pic, picture.Beside):
        out = _piece(pic.parts[0])
        for part in pic.parts[1:]:
            out = _vstack(out, _piece(part))
        return out
    if isinstance(pic, picture.Framed):
        return _frame(_piece(pic.inner), pic.title, repr(pic.param) if _has_params(pic.param) else None)
    if isinstance(pic, picture.Dot):
        return _node(pic.name, _wire_labels(pic.dom), _wire_labels(pic.cod))
    if isinstance(pic, picture.Boxed):
        return _box(pic.name, _wire_labels(pic.dom), _wire_labels(pic.cod),
                    repr(pic.param) if _has_params(pic.param) else None)
    raise UnsupportedError(f"no layout for the picture term {type(pic).__name__}: a lens's "
                           f"picture() is built from lenses.picture's terms")


def layout(lens) -> Layout:
    """The grid layout of `lens` (without the outer wire labels)."""
    return _piece(lens.picture())


def _lead(labels: list, side: str) -> Layout:
    """The diagram's boundary: a labelled stub per outer wire."""
    w = max([len(s) for s in labels] + [0]) + 3
    rows = [2 * i for i in range(len(labels))]
    if side == "in":
        items: list = [Text(0, r, s) for r, s in zip(rows, labels)]
        items += [Wire(((len(s) + 1, r), (w - 1, r))) for r, s in zip(rows, labels)]
        return Layout(w, max(len(rows) * 2 - 1, 1), [], rows, [], labels, items)
    items = [Text(w - len(s), r, s) for r, s in zip(rows, labels)]
    items += [Wire(((0, r), (w - len(s) - 2, r))) for r, s in zip(rows, labels)]
    return Layout(w, max(len(rows) * 2 - 1, 1), rows, [], labels, [], items)


def full_layout(lens) -> Layout:
    """The layout of `lens` with its input and output wires labelled at the boundary."""
    body = layout(lens)
    out = _hcat(_lead(body.in_labels, "in"), body, labelled=False)
    return _hcat(out, _lead(body.out_labels, "out"), labelled=False)


# -- text rendering ---------------------------------------------------------------------------

_N, _S, _E, _W = 1, 2, 4, 8
_CHARS = {
    _E | _W: "─", _N | _S: "│", _S | _E: "┌", _S | _W: "┐", _N | _E: "└", _N | _W: "┘",
    _N | _S | _E: "├", _N | _S | _W: "┤", _S | _E | _W: "┬", _N | _E | _W: "┴",
    _N | _S | _E | _W: "┼", _E: "─", _W: "─", _N: "│", _S: "│",
}


def _segment(dirs, a, b):
    (xa, ya), (xb, yb) = a, b
    if xa == xb and ya == yb:
        return
    if ya == yb:
        lo, hi = sorted((xa, xb))
        for x in range(lo, hi + 1):
            dirs[ya][x] |= (_E if x < hi else 0) | (_W if x > lo else 0)
    elif xa == xb:
        lo, hi = sorted((ya, yb))
        for y in range(lo, hi + 1):
            dirs[y][xa] |= (_S if y < hi else 0) | (_N if y > lo else 0)
    else:
        raise UnsupportedError(f"wire segment {a} → {b} is not on a row or a column")


def render(lay: Layout) -> str:
    """Rasterise a layout into box-drawing text."""
    h, w = lay.h, lay.w
    for item in lay.items:  # labels may run past the nominal width
        if isinstance(item, Text):
            w = max(w, item.x + len(item.s))
    dirs = [[0] * w for _ in range(h)]
    low: list[list[str | None]] = [[None] * w for _ in range(h)]   # frames: drawn under wires
    high: list[list[str | None]] = [[None] * w for _ in range(h)]  # text and node dots: over wires
    for item in lay.items:
        if isinstance(item, Wire):
            for a, b in zip(item.points, item.points[1:]):
                _segment(dirs, a, b)
        elif isinstance(item, Box):
            corners = [(item.x0, item.y0), (item.x1, item.y0), (item.x1, item.y1), (item.x0, item.y1)]
            for a, b in zip(corners, corners[1:] + corners[:1]):
                _segment(dirs, a, b)
            for i, ch in enumerate(item.name):
                high[item.name_y][item.x0 + 2 + i] = ch
        elif isinstance(item, Frame):
            for x in range(item.x0, item.x1 + 1):
                low[item.y0][x] = low[item.y1][x] = "┄"
            for y in range(item.y0, item.y1 + 1):
                low[y][item.x0] = low[y][item.x1] = "┆"
            low[item.y0][item.x0], low[item.y0][item.x1] = "╭", "╮"
            low[item.y1][item.x0], low[item.y1][item.x1] = "╰", "╯"
        elif isinstance(item, Node):
            high[item.y][item.x] = "●"
        elif isinstance(item, Text):
            for i, ch in enumerate(item.s):
                high[item.y][item.x + i] = ch
    lines = []
    for y in range(h):
        row = []
        for x in range(w):
            ch = high[y][x] or (_CHARS[dirs[y][x]] if dirs[y][x] else None) or low[y][x] or " "
            row.append(ch)
        lines.append("".join(row).rstrip())
    return "\n".join(lines)


def diagram(lens) -> str:
    """The string diagram of `lens` as text: boxes left to right, wires labelled with their
    spaces, parameter wires from above labelled with the parameter object.

    Examples:
        >>> print(diagram(dense(2, 3) >> tanh))
                 R^{3×2} × R^3
                       │
                 ┌─────┴──────┐         ┌──────┐
        R^2 ─────┤ dense(2→3) ├─ R^3 ───┤ tanh ├───── R^3
                 └────────────┘         └──────┘
    """
    picture.need_drawable(lens, "diagram")
    return render(full_layout(lens))


# -- matplotlib -------------------------------------------------------------------------------

def draw(lens, ax=None, backward: bool = False, fontsize: float = 9.0):
    """The string diagram of `lens` as a matplotlib figure (returned); with `backward`, the
    backward part's direction as arrows right to left (and up the parameter wires).

    Examples:
        >>> fig = draw(dense(2, 3) >> tanh >> dense(3, 1))
        >>> type(fig).__name__
        'Figure'
    """
    import matplotlib.pyplot as plt  # optional dependency: imported only when drawing
    from matplotlib.patches import FancyBboxPatch, Rectangle

    _check_drawing(lens, fontsize, "draw", ax)
    backward = flag(backward, "draw: backward")
    lay = full_layout(lens)
    if ax is None:
        fig = plt.figure(figsize=_figsize(lay, fontsize))
        ax = fig.add_axes((0, 0, 1, 1))
    else:
        fig = ax.figure
    H = lay.h

    def P(x, y):
        return x, H - 1 - y

    text_kw = dict(fontsize=fontsize, va="center")
    for item in lay.items:
        if isinstance(item, Wire):
            xs, ys = zip(*(P(x, y) for x, y in item.points))
            colour = "tab:blue" if item.kind == "param" else "black"
            ax.plot(xs, ys, color=colour, lw=1.2, zorder=1, gid=f"wire:{item.kind}")
            if backward:
                _backward_arrows(ax, item, P)
        elif isinstance(item, Box):
            x0, y1 = P(item.x0, item.y1)
            x1, y0 = P(item.x1, item.y0)
            ax.add_patch(FancyBboxPatch((x0, y1), x1 - x0, y0 - y1, boxstyle="round,pad=0,rounding_size=0.3",
                                        facecolor="#f3f3f3", edgecolor="black", lw=1.2, zorder=2,
                                        gid=f"box:{item.name}"))
            ax.text((x0 + x1) / 2, H - 1 - item.name_y, item.name, ha="center", zorder=3,
                    family="monospace", **text_kw)
        elif isinstance(item, Frame):
            x0, y1 = P(item.x0, item.y1)
            x1, y0 = P(item.x1, item.y0)
            ax.add_patch(Rectangle((x0, y1), x1 - x0, y0 - y1, fill=False, ls="--", edgecolor="grey",
                                   zorder=0, gid=f"frame:{item.title}"))
        elif isinstance(item, Node):
            x, y = P(item.x, item.y)
            ax.plot([x], [y], "o", color="black", ms=6, zorder=3, gid=f"node:{item.name}")
        elif isinstance(item, Text):
            x, y = P(item.x, item.y)
            colour = {"param": "tab:blue", "title": "grey"}.get(item.kind, "black")
            s = _math(item.s.strip()) if item.kind in ("label", "param") else item.s.strip()
            ax.text(x + len(item.s) / 2 - 0.5, y, s, ha="center", color=colour, zorder=4,
                    bbox=dict(facecolor="white", edgecolor="none", pad=0.3), **text_kw)
    ax.set_xlim(-1, lay.w)
    ax.set_ylim(-1, H)
    ax.axis("off")
    return fig


def _check_drawing(lens, fontsize, who: str, ax=None) -> None:
    """Refuse what no diagram is drawn of, axes not matplotlib's, a font size not > 0 points."""
    from matplotlib.axes import Axes
    picture.need_drawable(lens, who)
    if ax is not None and not isinstance(ax, Axes):
        raise KindError(f"{who}: ax must be matplotlib Axes (or None: a new figure), got {ax!r}")
    real_number(fontsize, f"{who}: fontsize", above=0, hint=" (points, e.g. 9.0)")


def _figsize(lay: Layout, fontsize: float) -> tuple:
    cw, rh = 0.62 * fontsize / 72, 1.9 * fontsize / 72  # one grid cell, in inches
    return max(lay.w * cw, 2.0), max(lay.h * rh, 1.0)


def svg(lens, fontsize: float = 9.0) -> str:
    """The string diagram of `lens` (as `draw` makes it) as SVG text. The figure is made
    without pyplot, so that showing a lens in a notebook opens no figure of its own."""
    import io

    from matplotlib.figure import Figure  # optional dependency: imported only when drawing

    _check_drawing(lens, fontsize, "svg")
    fig = Figure(figsize=_figsize(full_layout(lens), fontsize))
    draw(lens, ax=fig.add_axes((0, 0, 1, 1)), fontsize=fontsize)
    out = io.StringIO()
    fig.savefig(out, format="svg")
    return out.getvalue()


picture.register_svg(svg)  # how every lens shows itself in a notebook (`_repr_svg_`)


def _math(label: str) -> str:
    """A space's name as mathtext: R^{16×4} × R^16 → $\\mathbb{R}^{16\\times4} \\times \\mathbb{R}^{16}$."""
    if not label or "?" in label:
        return label
    s = re.sub(r"R\^(\d+)", r"R^{\1}", label)
    s = s.replace("R", r"\mathbb{R}").replace("×", r"\times ")
    return f"${s}$"


def _backward_arrows(ax, wire: Wire, P):
    """An arrow against the wire's forward direction: covectors travel right to left on data
    wires and up the parameter wires (they stay on the parameter objects)."""
    pts = [P(x, y) for x, y in wire.points]
    (xa, ya), (xb, yb) = max(zip(pts, pts[1:]), key=lambda ab: abs(ab[0][0] - ab[1][0]) + abs(ab[0][1] - ab[1][1]))
    if wire.kind == "param":
        start, end = (xa + 0.8, min(ya, yb)), (xa + 0.8, max(ya, yb))
    else:
        if abs(xb - xa) < 2.5:  # lead stubs inside a box layout: no room for an arrow
            return
        lo, hi = sorted((xa, xb))
        start, end = (hi - 0.3, ya - 0.55), (lo + 0.3, ya - 0.55)
    ax.annotate("", xy=end, xytext=start, gid="backward", zorder=5,
                arrowprops=dict(arrowstyle="->", color="tab:red", lw=1.0))


__all__ = ["expression", "diagram", "draw", "svg", "layout", "full_layout", "render"]
