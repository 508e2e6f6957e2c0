#!/usr/bin/env python3
"""tools/check_proxy_stubs.py -- contrib/plproxy/proxy.sql checked against
the flagmeter functions its calls run on a shard (`make check-proxy`).

The proxy database's API (contrib/plproxy/proxy.sql, with the parts of
PROXY_PARTS in the Makefile before it) is written by hand: per-tenant
PL/Proxy stubs that RUN ON a shard the flagmeter function of the same name,
calls split by shard, merges of every shard's answer, and catalog calls
that run a flagmeter call on every shard by two-phase commit.  PL/Proxy
calls the shard's function by the stub's own argument types, and a client
calls the proxy as it calls one node: a stub whose arguments, defaults or
result drift from the function it routes to fails at run time or answers
differently, and a call added to flagmeter without a stub is missing from
the proxy.  This reads the SQL (no server needed) and exits 1, listing
each problem, when:

  - a flagmeter call that the proxy must serve has no function of the
    same signature in the proxy: the calls of access_privileges() (what
    sql/parts/80_security.sql grants to roles) and every function whose
    first argument is a tenant, less NOT_PROXIED below (each with why);
  - a proxy function of the same name and argument types as a flagmeter
    function differs from it in argument names, modes, defaults or result,
    or is not revoked from PUBLIC where flagmeter's is (or the reverse);
  - a PL/Proxy function runs on a shard (implicitly its own name, its
    TARGET, or the flagmeter.f(...) its SELECT calls) a function that
    does not exist there with those argument types, returns what that
    function does not, routes by something that is not its argument
    (a stub with a tenant argument must route by it), or reads a
    relation flagmeter does not have (SELECT * from a view: its columns);
  - a catalog call's command for the shards, format('SELECT
    flagmeter.f(%L::type, ...)', arg, ...), names a function or argument
    types flagmeter does not have, or passes arguments of other types or
    number than the placeholders;
  - a call inside the proxy's own SQL or PL/pgSQL names a flagmeter.f the
    proxy does not define; a COMMENT ON or REVOKE names a signature the
    proxy does not define; NOT_PROXIED names what no longer exists or what
    is proxied after all.

Checking rather than generating the stubs: the simple routed stubs are a
third of proxy.sql; the rest (the split batch calls, the merges, the
two-phase commit wrappers) must be written by hand anyway, and each stub
carries its own ROWS estimate and COMMENT.  A check covers both kinds
with one rule set, while a generator would cover only the first.

Usage: python3 tools/check_proxy_stubs.py [ROOT]   (default: the repository)
"""

import os
import re
import sys

# Calls of flagmeter that the proxy deliberately does not serve, by
# signature, with the reason.  A call named here must exist in flagmeter
# and must not be in the proxy.
NOT_PROXIED = {
    # not yet proxied (proxy.sql's header): every shard or none
    "drop_plan(text, boolean)": "not yet proxied: every shard or none",
    "drop_meter(text, boolean)": "not yet proxied: every shard or none",
    # the untyped overloads: the proxy's typed ones take the same calls
    "consume(text, text, text, text)": "untyped overload, not yet proxied",
    "track(text, text, bigint, text, text)": "untyped overload, not yet proxied",
    # an id names no shard: called on the tenant's shard (proxy.sql)
    "void_grant(bigint)": "takes a grant id, which names no shard",
    "settle(bigint, bigint)": "takes a reservation id, which names no shard",
    "release(bigint)": "takes a reservation id, which names no shard",
    # the shard-side halves of the proxy's catalog calls
    "store_limit(text, text, bigint, text, text, integer[], integer, bigint, integer)":
        "set_limit's first half, run on every shard by the proxy's set_limit",
    "announce_limit(text, text)": "set_limit's second half, run on every shard by the proxy's set_limit",
    "store_feature(text, text, boolean, jsonb)":
        "set_feature's first half, run on every shard by the proxy's set_feature",
    "announce_plan_feature(text, text)":
        "set_feature's second half, run on every shard by the proxy's set_feature",
    "store_rate_limit(text, text, text, bigint, interval, bigint)":
        "set_rate_limit's first half, run on every shard by the proxy's set_rate_limit; "
        "override_rate_limit's, run on the tenant's shard",
    "announce_rate_limit(text, text, text)":
        "the second half of set_rate_limit and override_rate_limit, run where the first ran",
    "delete_rate_limit(text, text, text)": "the body of drop_rate_limit and drop_rate_override on the shard",
    "drop_rate_limit(text, text)": "not yet proxied: every shard or none, and its answer is per shard",
    # keys of one batch route to different shards
    "limit_batch(text[], bigint[], interval[], bigint[], bigint[])":
        "its keys route to different shards: the proxy's limit() routes each key",
    # what flagmeter's own calls use on the shard
    "announce(text, text, text, text, timestamptz, bigint, bigint, text, text, integer[])":
        "for the catalog functions on the shard, not for apps",
    "announce_feature(text, text, text, boolean, jsonb)": "for the catalog functions on the shard, not for apps",
    "apply_limit_changes(jsonb)": "internal to the catalog functions on the shard",
    "check_tenant(text)": "a validator, run where the tenant's call runs",
    "limit_in_force(text, text)": "internal to the C calls on the shard",
    "limit_configs(text, text)": "internal to limit_config and the views on the shard",
    "series(text, text, timestamptz, timestamptz, text, text)": "the body of usage_series on the shard",
    "unique_series(text, text, timestamptz, timestamptz, text, text)":
        "the body of usage_series of a unique meter on the shard",
    "recount_unique_values(text, text, timestamptz, timestamptz)": "internal to recounts on the shard",
    "has_pending_events(text, text)": "internal to recounts on the shard",
    "pending_drop(text, text, timestamptz)": "internal to recounts on the shard",
    "partition_of(text, integer)": "the shard's side of moving a partition (flagmeter-move-partition)",
    # administration of one shard, run there
    "delete_usage(text, text)": "administration of one shard, run there",
    "current_period_has_usage(text, text)": "administration of one shard, run there",
    "recount_current_period(text, text)": "administration of one shard, run there",
    "review_usage(text, text)": "administration of one shard, run there",
    "review_blocks(text, text, text)": "administration of one shard, run there",
}

TYPE_ALIASES = {
    "int": "integer", "int4": "integer", "int8": "bigint", "int2": "smallint",
    "bool": "boolean", "float8": "double precision", "float4": "real",
    "timestamp with time zone": "timestamptz", "varchar": "character varying",
    "decimal": "numeric", "time with time zone": "timetz",
    "timestamp without time zone": "timestamp",
}
MULTIWORD_TYPES = ("double precision", "timestamp with time zone", "timestamp without time zone",
                   "character varying", "time with time zone", "bit varying")
FUNC_OPTIONS = r"(?:LANGUAGE|AS|IMMUTABLE|STABLE|VOLATILE|STRICT|CALLED|PARALLEL|SET|ROWS|COST|SECURITY|" \
    r"EXTERNAL|LEAKPROOF|NOT|WINDOW|TRANSFORM|SUPPORT|RETURNS\s+NULL)\b"


def quoted_end(sql, i):
    """Where the string literal, quoted identifier or dollar-quoted string
    starting at i ends (the index after it), or None when none starts."""
    c, n = sql[i], len(sql)
    if c in "'\"":
        j = i + 1
        while j < n:
            if sql[j] == c:
                if j + 1 < n and sql[j + 1] == c:
                    j += 2
                    continue
                return j + 1
            j += 1
        return n
    if c == "$":
        m = re.match(r"\$([A-Za-z_]\w*)?\$", sql[i:])
        if m and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == "_")):
            j = sql.find(m.group(0), i + len(m.group(0)))
            return n if j < 0 else j + len(m.group(0))
    return None


def strip_comments(sql):
    """The SQL with comments blanked out, string literals, quoted
    identifiers and dollar-quoted bodies kept as they are."""
    out, i, n = [], 0, len(sql)
    while i < n:
        if sql.startswith("--", i) or sql.startswith("/*", i):
            j = sql.find("\n", i) if sql[i] == "-" else sql.find("*/", i + 2)
            i = n if j < 0 else (j if sql[i] == "-" else j + 2)
            out.append(" ")
            continue
        j = quoted_end(sql, i)
        if j is None:
            j = i + 1
        out.append(sql[i:j])
        i = j
    return "".join(out)


def outside_quotes(text, start=0):
    """(index, character, depth) of each character of text from start that
    is outside quotes, depth counting the parentheses and brackets open
    before it (a closing one counts as still open)."""
    depth, quote = 0, None
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            if c == quote:
                quote = None
            continue
        if c in "'\"":
            quote = c
            continue
        if c in "([":
            depth += 1
        yield i, c, depth
        if c in ")]":
            depth -= 1


def split_top(text, sep=","):
    """text split at sep outside parentheses, brackets, quotes."""
    cuts = [i for i, c, depth in outside_quotes(text) if c == sep and depth == 0]
    parts = [text[a + 1:b] for a, b in zip([-1] + cuts, cuts + [len(text)])]
    if not parts[-1].strip():
        parts.pop()
    return [p.strip() for p in parts]


def statements(sql):
    """Top-level statements of comment-free SQL, with their offsets."""
    out, start, i, n = [], 0, 0, len(sql)
    while i < n:
        j = quoted_end(sql, i)
        if j is not None:
            i = j
            continue
        if sql[i] == ";":
            out.append((sql[start:i].strip(), start))
            start = i + 1
        i += 1
    if sql[start:].strip():
        out.append((sql[start:].strip(), start))
    return out


def balanced(text, open_at):
    """Index of the parenthesis closing the one at open_at."""
    for i, c, depth in outside_quotes(text, open_at):
        if c == ")" and depth == 1:
            return i
    raise ValueError("unbalanced parentheses")


def unquote(name):
    return name.replace('"', "").lower()


def norm_type(t):
    t = " ".join(t.replace('"', "").lower().split())
    t = re.sub(r"\bpg_catalog\.", "", t)
    arr = ""
    while t.endswith("[]"):
        arr += "[]"
        t = t[:-2].strip()
    return TYPE_ALIASES.get(t, t) + arr


def norm_default(d, typ):
    if d is None:
        return None
    d = " ".join(d.split())
    d = re.sub(r"\bpg_catalog\.", "", d)
    m = re.match(r"^(.*?)::([\w .\[\]\"]+)$", d)
    if m and norm_type(m.group(2)) == typ:
        d = m.group(1).strip()
    if re.fullmatch(r"(?i)null|true|false", d):
        d = d.upper()
    return d


class Arg:
    def __init__(self, text):
        text = text.strip()
        self.default = None
        m = re.search(r"(?is)\s(?:DEFAULT|=)\s(.*)$", " " + text)
        if m:
            self.default = m.group(1).strip()
            text = (" " + text)[:m.start()].strip()
        self.mode = "in"
        m = re.match(r"(?i)(IN|OUT|INOUT|VARIADIC)\s+(.*)$", text, re.S)
        if m:
            self.mode = m.group(1).lower()
            text = m.group(2)
        self.name = None
        if norm_type(text) not in [norm_type(x) for x in MULTIWORD_TYPES]:
            m = re.match(r'^("[^"]+"|[A-Za-z_]\w*)\s+(\S.*)$', text, re.S)
            if m:
                self.name = unquote(m.group(1))
                text = m.group(2)
        self.type = norm_type(text)
        self.default = norm_default(self.default, self.type)

    def __str__(self):
        s = ("" if self.mode == "in" else self.mode.upper() + " ") + (self.name or "") + " " + self.type
        return s.strip() + (" DEFAULT " + self.default if self.default is not None else "")


class Function:
    def __init__(self, stmt, path, line):
        self.path, self.line = path, line
        m = re.match(r"(?is)CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([\w.\"]+)\s*\(", stmt)
        name = unquote(m.group(1))
        self.schema, _, self.name = name.rpartition(".")
        close = balanced(stmt, m.end() - 1)
        self.args = [Arg(a) for a in split_top(stmt[m.end():close])]
        rest = stmt[close + 1:]
        # the body: the first dollar-quoted string, or AS 'obj', 'sym'
        self.body = ""
        bm = re.search(r"(?s)\bAS\s+(\$(?:[A-Za-z_]\w*)?\$)(.*?)\1", rest)
        if bm:
            self.body = bm.group(2)
            head = rest[:bm.start()] + " AS $$$$ " + rest[bm.end():]
        else:
            head = rest
        lm = re.search(r"(?i)\bLANGUAGE\s+(\w+)", head)
        self.language = lm.group(1).lower() if lm else None
        rm = re.search(r"(?is)\bRETURNS\s+(.*?)\s*(?=\b" + FUNC_OPTIONS + r"|$)", head)
        self.returns_text = rm.group(1).strip() if rm else "void"
        self.revoked = False
        self.commented = False

    @property
    def in_args(self):
        return [a for a in self.args if a.mode in ("in", "inout", "variadic")]

    @property
    def in_types(self):
        return tuple(a.type for a in self.in_args)

    @property
    def signature(self):
        return "%s(%s)" % (self.name, ", ".join(self.in_types))

    def result(self):
        """(setof, columns or None, type): columns as (name, type)."""
        r = self.returns_text
        setof = False
        m = re.match(r"(?is)TABLE\s*\((.*)\)\s*$", r)
        if m:
            cols = [Arg(c) for c in split_top(m.group(1))]
            return (True, tuple((c.name, c.type) for c in cols), "record")
        m = re.match(r"(?is)SETOF\s+(.*)$", r)
        if m:
            setof, r = True, m.group(1)
        outs = [a for a in self.args if a.mode in ("out", "inout")]
        if outs:
            return (setof, tuple((a.name, a.type) for a in outs), "record")
        return (setof, None, norm_type(r))

    def where(self):
        return "%s:%d" % (self.path, self.line)


def show_result(res):
    setof, cols, typ = res
    body = "TABLE (%s)" % ", ".join("%s %s" % c for c in cols) if cols else typ
    return ("SETOF " if setof and not cols else "") + body


def load(paths, root):
    """Functions, relations (name -> columns or None), revokes, comments,
    aggregates of the files."""
    funcs, rels, revokes, comments, aggs = [], {}, set(), [], set()
    for path in paths:
        with open(os.path.join(root, path)) as fh:
            raw = fh.read()
        sql = strip_comments(raw)
        for stmt, off in statements(sql):
            line = sql.count("\n", 0, off + (len(sql[off:]) - len(sql[off:].lstrip()))) + 1
            if re.match(r"(?is)CREATE\s+(OR\s+REPLACE\s+)?FUNCTION\b", stmt):
                funcs.append(Function(stmt, path, line))
            elif re.match(r"(?is)CREATE\s+(OR\s+REPLACE\s+)?(MATERIALIZED\s+)?VIEW\b", stmt):
                m = re.match(r"(?is)CREATE\s+(?:OR\s+REPLACE\s+)?(?:MATERIALIZED\s+)?VIEW\s+([\w.\"]+)\s+AS\s+(.*)$", stmt)
                rels[unquote(m.group(1))] = view_columns(m.group(2))
            elif re.match(r"(?is)CREATE\s+(UNLOGGED\s+)?TABLE\b", stmt):
                m = re.match(r"(?is)CREATE\s+(?:UNLOGGED\s+)?TABLE\s+([\w.\"]+)", stmt)
                rels[unquote(m.group(1))] = None
            elif re.match(r"(?is)CREATE\s+AGGREGATE\b", stmt):
                m = re.match(r"(?is)CREATE\s+AGGREGATE\s+([\w.\"]+)", stmt)
                aggs.add(unquote(m.group(1)).rpartition(".")[2])
            elif re.match(r"(?is)REVOKE\s+ALL\s+ON\s+FUNCTION\b", stmt) and re.search(r"(?i)FROM\s+PUBLIC\s*$", stmt):
                m = re.match(r"(?is)REVOKE\s+ALL\s+ON\s+FUNCTION\s+([\w.\"]+)\s*\((.*?)\)\s+FROM", stmt)
                revokes.add((path, line, sig_of(m.group(1), m.group(2))))
            elif re.match(r"(?is)COMMENT\s+ON\s+FUNCTION\b", stmt):
                m = re.match(r"(?is)COMMENT\s+ON\s+FUNCTION\s+([\w.\"]+)\s*\((.*?)\)\s+IS", stmt)
                comments.append((path, line, sig_of(m.group(1), m.group(2))))
    return funcs, rels, revokes, comments, aggs


def sig_of(name, types):
    name = unquote(name).rpartition(".")[2]
    return "%s(%s)" % (name, ", ".join(norm_type(t) for t in split_top(types)))


def view_columns(query):
    """Output column names of SELECT ... FROM (top level)."""
    m = re.match(r"(?is)\s*SELECT\s+(.*)$", query)
    if not m:
        return None
    text, end = m.group(1), None
    for i, c, depth in outside_quotes(m.group(1)):
        if depth == 0 and re.match(r"(?i)FROM\b", text[i:]) and (i == 0 or not text[i - 1].isalnum()):
            end = i
            break
    cols = []
    for item in split_top(text[:end]):
        am = re.search(r'(?is)\bAS\s+("?[\w]+"?)\s*$', item)
        if am:
            cols.append(unquote(am.group(1)))
        else:
            cols.append(unquote(re.split(r"\.", item)[-1].strip()))
    return tuple(cols)


def makefile_proxy_parts(root):
    with open(os.path.join(root, "Makefile")) as fh:
        text = fh.read().replace("\\\n", " ")
    m = re.search(r"^PROXY_PARTS\s*=\s*(.*)$", text, re.M)
    if not m:
        sys.exit("check_proxy_stubs: no PROXY_PARTS in the Makefile")
    return m.group(1).split()


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    parts = sorted(os.path.join("sql/parts", f) for f in os.listdir(os.path.join(root, "sql/parts"))
                   if f.endswith(".sql"))
    proxy_parts = makefile_proxy_parts(root)
    proxy_file = [p for p in proxy_parts if p.startswith("contrib/")]
    if len(proxy_file) != 1:
        sys.exit("check_proxy_stubs: PROXY_PARTS names no single contrib/ file")
    proxy_file = proxy_file[0]

    s_funcs, s_rels, s_revokes, _, _ = load(parts, root)
    p_funcs_all, p_rels, p_revokes, p_comments, p_aggs = load(proxy_parts, root)
    p_own = [f for f in p_funcs_all if f.path == proxy_file]
    problems = []

    def problem(where, text):
        problems.append("%s: %s" % (where, text))

    shard = {}
    for f in s_funcs:
        shard.setdefault(f.name, []).append(f)
    shard_sig = {f.signature: f for f in s_funcs}
    proxy_sig = {f.signature: f for f in p_funcs_all}
    proxy_names = {f.name for f in p_funcs_all} | p_aggs
    s_revoked = {sig for _, _, sig in s_revokes}
    p_revoked = {sig for _, _, sig in p_revokes}

    # COMMENT ON and REVOKE name functions the proxy defines
    for path, line, sig in sorted(p_comments + [r for r in p_revokes]):
        if sig not in proxy_sig:
            problem("%s:%d" % (path, line), "names flagmeter.%s, which the proxy does not define" % sig)

    # the proxy's versions of flagmeter's calls: the same signature
    for f in p_own:
        if f.name not in shard:
            continue
        twin = shard_sig.get(f.signature)
        if twin is None:
            problem(f.where(), "flagmeter.%s matches no flagmeter function of that name and argument "
                    "types (flagmeter has %s)" % (f.signature, ", ".join(g.signature for g in shard[f.name])))
            continue
        compare(f, twin, problem)
        if (f.signature in p_revoked) != (f.signature in s_revoked):
            problem(f.where(), "flagmeter.%s is %srevoked from PUBLIC in the proxy but %s on the shards (%s)"
                    % (f.signature, "" if f.signature in p_revoked else "not ",
                       "not" if f.signature in p_revoked else "is", twin.where()))

    # what PL/Proxy runs on the shards
    for f in p_own:
        if f.language == "plproxy":
            check_plproxy(f, shard, shard_sig, s_rels, problem)
        else:
            check_wrapper(f, shard, proxy_names, problem)

    # the calls the proxy must serve
    api = set()
    with open(os.path.join(root, "sql/parts/80_security.sql")) as fh:
        security = fh.read()
    am = re.search(r"(?is)CREATE\s+FUNCTION\s+flagmeter\.access_privileges\b.*?\$\$(.*?)\$\$", security)
    if not am:
        problem("sql/parts/80_security.sql", "no access_privileges() to read the API from")
    else:
        for name, types in re.findall(r"'(?:FUNCTION\s+)?flagmeter\.(\w+)\(([^)]*)\)'", am.group(1)):
            api.add(sig_of(name, types))
    for f in s_funcs:
        if f.in_args and f.in_args[0].name in ("tenant", "tenants"):
            api.add(f.signature)
    for sig in sorted(api):
        if sig not in shard_sig:
            problem("sql/parts/80_security.sql", "access_privileges() names flagmeter.%s, which does not exist" % sig)
        elif sig not in proxy_sig and sig not in NOT_PROXIED:
            problem(shard_sig[sig].where(), "flagmeter.%s has no stub in %s (or add it to NOT_PROXIED in "
                    "tools/check_proxy_stubs.py, saying why)" % (sig, proxy_file))
    for sig in sorted(NOT_PROXIED):
        if sig not in shard_sig:
            problem("tools/check_proxy_stubs.py", "NOT_PROXIED names flagmeter.%s, which does not exist" % sig)
        elif sig in proxy_sig:
            problem("tools/check_proxy_stubs.py", "NOT_PROXIED names flagmeter.%s, which the proxy defines (%s)"
                    % (sig, proxy_sig[sig].where()))

    for p in problems:
        print(p)
    if problems:
        print("%d problem%s in the proxy's stubs (%s against sql/parts)"
              % (len(problems), "" if len(problems) == 1 else "s", proxy_file))
        return 1
    print("proxy stubs: the %d functions of %s match flagmeter's; of the %d calls it must serve, %d are "
          "proxied, %d are not (NOT_PROXIED)" % (len(p_own), proxy_file, len(api),
                                                len([s for s in api if s in proxy_sig]),
                                                len([s for s in api if s not in proxy_sig])))
    return 0


def compare(f, twin, problem):
    """f (proxy) against twin (flagmeter): names, modes, types, defaults, result."""
    fa, ta = f.args, twin.args
    if len(fa) != len(ta):
        problem(f.where(), "flagmeter.%s has arguments (%s), flagmeter's (%s) has (%s)"
                % (f.signature, ", ".join(map(str, fa)), twin.where(), ", ".join(map(str, ta))))
    else:
        for a, b in zip(fa, ta):
            if (a.mode, a.name, a.type, a.default) != (b.mode, b.name, b.type, b.default):
                problem(f.where(), "flagmeter.%s: argument \"%s\" differs from flagmeter's \"%s\" (%s)"
                        % (f.signature, a, b, twin.where()))
    if f.result() != twin.result():
        problem(f.where(), "flagmeter.%s returns %s, flagmeter's returns %s (%s)"
                % (f.signature, show_result(f.result()), show_result(twin.result()), twin.where()))


def shard_call(name, types, shard, n_given=None):
    """The flagmeter function name(types...) a call would resolve to: exact
    argument types, the ones not given having defaults."""
    for g in shard.get(name, []):
        ins = g.in_args
        if len(types) > len(ins):
            continue
        if tuple(types) == tuple(a.type for a in ins[:len(types)]) and \
                all(a.default is not None for a in ins[len(types):]):
            return g
    return None


def check_plproxy(f, shard, shard_sig, s_rels, problem):
    body = strip_comments(f.body)
    params = {a.name: a for a in f.in_args if a.name}
    stmts = [s.strip() for s in split_top(body, ";") if s.strip()]
    run = [s for s in stmts if re.match(r"(?i)RUN\s+ON\b", s)]
    target = [s for s in stmts if re.match(r"(?i)TARGET\b", s)]
    select = [s for s in stmts if re.match(r"(?i)SELECT\b", s)]
    split = [s for s in stmts if re.match(r"(?i)SPLIT\b", s)]
    if not [s for s in stmts if re.match(r"(?i)CLUSTER\b", s)]:
        problem(f.where(), "flagmeter.%s: a PL/Proxy function without CLUSTER" % f.signature)
    if len(run) != 1:
        problem(f.where(), "flagmeter.%s: a PL/Proxy function without one RUN ON" % f.signature)
    else:
        on = re.match(r"(?is)RUN\s+ON\s+(.*)$", run[0]).group(1).strip()
        hm = re.match(r"(?is)([\w.]+)\s*\(\s*(\w+)\s*\)$", on)
        if hm:
            if hm.group(2).lower() not in params:
                problem(f.where(), "flagmeter.%s routes by %s, which is not one of its arguments"
                        % (f.signature, hm.group(2)))
            by = hm.group(2).lower()
        elif re.fullmatch(r"(?i)ALL|ANY|\d+", on):
            by = None
        elif on.lower() in params:
            by = on.lower()
        else:
            problem(f.where(), "flagmeter.%s routes by %s, which is not one of its arguments" % (f.signature, on))
            by = None
        if "tenant" in params and by != "tenant":
            problem(f.where(), "flagmeter.%s takes a tenant but routes by %s" % (f.signature, on))
        if split:
            names = [x.strip().lower() for x in re.sub(r"(?i)^SPLIT\s+", "", split[0]).split(",")]
            for n in names:
                if n != "all" and n not in params:
                    problem(f.where(), "flagmeter.%s splits %s, which is not one of its arguments" % (f.signature, n))

    if select:
        sel = select[0]
        for cm in re.finditer(r"(?i)\bflagmeter\.(\w+)\s*\(", sel):
            close = balanced(sel, cm.end() - 1)
            args = split_top(sel[cm.end():close])
            types = []
            for a in args:
                pm = re.fullmatch(r"\$(\d+)", a)
                if pm and 0 < int(pm.group(1)) <= len(f.in_args):
                    types.append(f.in_args[int(pm.group(1)) - 1].type)
                elif a.lower() in params:
                    types.append(params[a.lower()].type)
                else:
                    types = None
                    break
            name = cm.group(1).lower()
            if name not in shard:
                problem(f.where(), "flagmeter.%s runs flagmeter.%s on the shards, which does not exist"
                        % (f.signature, name))
                continue
            g = shard_call(name, types, shard) if types is not None else shard[name][0]
            if g is None:
                problem(f.where(), "flagmeter.%s runs flagmeter.%s(%s) on the shards: flagmeter has %s"
                        % (f.signature, name, ", ".join(types), ", ".join(x.signature for x in shard[name])))
                continue
            whole = re.fullmatch(r"(?is)SELECT\s+(?:\*\s+FROM\s+)?flagmeter\.\w+\s*\(.*\)", sel)
            if whole and strip_setof(f.result()) != strip_setof(g.result()):
                problem(f.where(), "flagmeter.%s returns %s, the flagmeter.%s it runs returns %s (%s)"
                        % (f.signature, show_result(f.result()), g.signature, show_result(g.result()), g.where()))
        for rm in re.finditer(r"(?i)\b(?:FROM|JOIN)\s+flagmeter\.(\w+)\b(?!\s*\()", sel):
            rel = "flagmeter." + rm.group(1).lower()
            if rel not in s_rels:
                problem(f.where(), "flagmeter.%s reads %s on the shards, which flagmeter does not have"
                        % (f.signature, rel))
            elif re.fullmatch(r"(?is)SELECT\s+\*\s+FROM\s+flagmeter\.\w+", sel) and s_rels[rel] is not None:
                cols = f.result()[1]
                names = tuple(c[0] for c in cols) if cols else None
                if names != s_rels[rel]:
                    problem(f.where(), "flagmeter.%s returns the columns (%s), the shards' %s has (%s)"
                            % (f.signature, ", ".join(names or ()), rel, ", ".join(s_rels[rel])))
        if target:
            problem(f.where(), "flagmeter.%s has both TARGET and SELECT" % f.signature)
        return

    # TARGET, or the function's own name: called with the stub's arguments
    name = f.name
    if target:
        name = unquote(re.match(r"(?is)TARGET\s+([\w.\"]+)", target[0]).group(1)).rpartition(".")[2]
    g = None
    for cand in shard.get(name, []):
        if cand.in_types == f.in_types:
            g = cand
    if g is None:
        have = ", ".join(x.signature for x in shard.get(name, [])) or "none of that name"
        problem(f.where(), "flagmeter.%s runs flagmeter.%s(%s) on the shards, which does not exist (flagmeter has %s)"
                % (f.signature, name, ", ".join(f.in_types), have))
    elif target and strip_setof(f.result()) != strip_setof(g.result()):
        problem(f.where(), "flagmeter.%s returns %s, its TARGET flagmeter.%s returns %s (%s)"
                % (f.signature, show_result(f.result()), g.signature, show_result(g.result()), g.where()))


def strip_setof(res):
    return (res[1], res[2])


def literals(body):
    """The string literals of a body, '' unescaped, adjacent ones (SQL's
    continuation across lines) joined, with the text after each."""
    out = []
    for m in re.finditer(r"'((?:[^']|'')*)'", body):
        out.append((m.start(), m.end(), m.group(1).replace("''", "'")))
    joined = []
    for s, e, t in out:
        if joined and re.fullmatch(r"\s*\n\s*", body[joined[-1][1]:s]):
            ps, _, pt = joined[-1]
            joined[-1] = (ps, e, pt + t)
        else:
            joined.append((s, e, t))
    return joined


def check_wrapper(f, shard, proxy_names, problem):
    """A PL/pgSQL or SQL function of the proxy: the shard commands it
    formats, and the proxy functions it calls."""
    body = strip_comments(f.body)
    params = {a.name: a for a in f.args if a.name}
    # format('... SELECT flagmeter.f(%L::t, ...) ...', arg, ...)
    for fm in re.finditer(r"(?i)\bformat\s*\(", body):
        close = balanced(body, fm.end() - 1)
        inner = body[fm.end():close]
        lits = literals(inner)
        if not lits or lits[0][0] != len(inner) - len(inner.lstrip()):
            continue
        fmt_end, fmt = lits[0][1], lits[0][2]
        cm = re.fullmatch(r"(?is)\s*SELECT\s+flagmeter\.(\w+)\s*\((.*)\)\s*", fmt)
        if not cm:
            continue
        rest = inner[fmt_end:].strip()
        args = split_top(rest[1:]) if rest.startswith(",") else []
        placeholders = re.findall(r"%(?!%)[LIs]", fmt)
        if len(placeholders) != len(args):
            problem(f.where(), "flagmeter.%s: format() of flagmeter.%s has %d placeholders and %d arguments"
                    % (f.signature, cm.group(1), len(placeholders), len(args)))
        casts = []
        for item in split_top(cm.group(2)):
            im = re.fullmatch(r"%L::(.+)", item.strip())
            casts.append(norm_type(im.group(1)) if im else None)
        name = cm.group(1).lower()
        if name not in shard:
            problem(f.where(), "flagmeter.%s runs flagmeter.%s on every shard, which does not exist"
                    % (f.signature, name))
            continue
        if None in casts:
            problem(f.where(), "flagmeter.%s: flagmeter.%s(%s) on the shards: every argument as %%L::type, "
                    "so that the call resolves to one function" % (f.signature, name, cm.group(2)))
            continue
        g = shard_call(name, casts, shard)
        if g is None or len(casts) != len(g.in_args):
            problem(f.where(), "flagmeter.%s runs flagmeter.%s(%s) on every shard: flagmeter has %s"
                    % (f.signature, name, ", ".join(casts), ", ".join(x.signature for x in shard[name])))
        for arg, typ in zip(args, casts):
            a = params.get(unquote(arg)) if re.fullmatch(r'"?\w+"?', arg) else None
            if a is not None and a.type != typ:
                problem(f.where(), "flagmeter.%s passes %s (%s) to flagmeter.%s as %s"
                        % (f.signature, a.name, a.type, name, typ))
    # calls of the proxy's own functions, outside string literals
    code = re.sub(r"'(?:[^']|'')*'", "''", body)
    for cm in re.finditer(r"(?i)\bflagmeter\.(\w+)\s*\(", code):
        if cm.group(1).lower() not in proxy_names:
            problem(f.where(), "flagmeter.%s calls flagmeter.%s, which the proxy does not define"
                    % (f.signature, cm.group(1).lower()))


if __name__ == "__main__":
    sys.exit(main())
