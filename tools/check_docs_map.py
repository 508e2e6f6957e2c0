#!/usr/bin/env python3
"""tools/check_docs_map.py -- docs/architecture.md, and the comments of the
code, name what exists (`make check-docs`).

The architecture document is the map of the source tree: a table of the
rooms of src/, one of the parts of sql/parts/, and the path of each call
through them, naming files, C and SQL functions, types and settings in
backticks.  Code moves (a file split, a function renamed or merged) and
nothing reminds the map, so it sends the next reader after names that are
gone.  This reads the tree as it is when it runs and exits 1, listing each
stale name with its line, when the document

  - names a file (`track.c`, `sql/parts/*.sql`, `tools/pgindent.sh`, a
    glob, a directory, a Markdown link) that does not exist; a bare file
    name may live anywhere in the tree, a name with a slash is a path
    from the root;
  - names a function, `name()` or `name(args)`, that neither src/*.c
    defines (a line starting "name(") nor sql/parts/*.sql or
    contrib/plproxy/proxy.sql creates (CREATE FUNCTION or AGGREGATE);
  - names an identifier (`fm_scan_period`, `FmLimit.pool`,
    `flagmeter.stripes`, `counters_track_stripes`) that occurs as a word
    nowhere in the code (comments left out) of src/, sql/, contrib/ or
    fuzz/;
  - names a make target (`make test`) the Makefile does not have;
  - or leaves a src/*.c or sql/parts/*.sql file out of its tables;
or when a comment (any line but an #include) of src/, sql/, tools/ or
contrib/ cites a path of the tree (src/x.c, test/t/*.pl, docs/x.md;
relative to the tree or to one of its directories) that is not there.  Backticked text that is none of the
above (SQL such as `stripe > 0`, a Debian package) is not checked.

Usage: python3 tools/check_docs_map.py [DOC...]   (default: docs/architecture.md)
"""

import fnmatch
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CODE_DIRS = ("src", "sql", "contrib", "fuzz")
FILE_EXT = r"\.(?:c|h|sql|sh|pl|pm|py|js|mjs|ts|json|md|list|control|mk|spec|so|out)"
# where the code's comments are read for the paths they cite, and the
# top directories a cited path starts with
COMMENT_DIRS = ("src", "sql", "tools", "contrib")
TOP_DIRS = ("src", "sql", "tools", "contrib", "test", "docs", "bench", "fuzz", "clients", "examples")
# names the documents give that are not files of the tree
NOT_FILES = {
    "pg-bsd-indent": "a Debian package",
    "test/t/x.pl": "an example of prove's output (tools/test.sh)",
}


def tree_files():
    """The files of the tree: git's (tracked and untracked, not ignored),
    or every file when this is not a git checkout."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard"],
                             check=True, capture_output=True, text=True).stdout
        return [f for f in out.splitlines() if os.path.exists(os.path.join(ROOT, f))]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for d, _, files in os.walk(ROOT):
            found += [os.path.relpath(os.path.join(d, f), ROOT) for f in files]
        return found


def built_files():
    """What the build makes that documents may name: the library and the
    install scripts (the Makefile's DATA_built)."""
    with open(os.path.join(ROOT, "Makefile")) as fh:
        make = fh.read()
    ext = re.search(r"^EXTENSION\s*=\s*(\S+)", make, re.M).group(1)
    ver = re.search(r"^EXTVERSION\s*=\s*(\S+)", make, re.M).group(1)
    mod = re.search(r"^MODULE_big\s*=\s*(\S+)", make, re.M).group(1)
    built = {mod + ".so"}
    for m in re.finditer(r"^DATA_built\s*\+?=\s*(\S+)", make, re.M):
        built.add(m.group(1).replace("$(EXTENSION)", ext).replace("$(EXTVERSION)", ver))
    return built


def make_targets():
    with open(os.path.join(ROOT, "Makefile")) as fh:
        make = fh.read()
    targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", make, re.M))
    for inc in re.findall(r"^-?include\s+(\S+)$", make, re.M):
        path = os.path.join(ROOT, inc)
        if os.path.exists(path):
            with open(path) as fh:
                targets |= set(re.findall(r"^([\w.-]+)\s*:(?!=)", fh.read(), re.M))
    # PGXS's own
    return targets | {"install", "installcheck", "clean", "all", "check", "uninstall"}


def read(path):
    with open(os.path.join(ROOT, path), errors="replace") as fh:
        return fh.read()


def without_comments(path):
    """A source file without its comments: a name only a comment gives is
    no evidence that it exists."""
    text = re.sub(r"(?s)/\*.*?\*/", " ", read(path))
    if re.search(r"\.(?:c|h|js|mjs|ts)$", path):
        return re.sub(r"(?m)//.*$", " ", text)
    if re.search(r"\.sql$", path):
        return re.sub(r"(?m)--.*$", " ", text)
    if re.search(r"\.(?:sh|pl|pm|py|mk)$|(^|/)[^.]+$", path):
        return re.sub(r"(?m)^\s*#.*$", " ", text)
    return text


def main():
    docs = sys.argv[1:] or ["docs/architecture.md"]
    files = tree_files()
    basenames = {os.path.basename(f) for f in files}
    dirs = {os.path.dirname(f) for f in files}
    dirs |= {d.rsplit("/", i)[0] for d in list(dirs) for i in range(1, d.count("/") + 1)}
    built = built_files()
    code_files = [f for f in files if f.split("/")[0] in CODE_DIRS]
    words = set()
    for f in code_files:
        words |= set(re.findall(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*", without_comments(f)))
    words |= {part for w in list(words) for part in w.split(".")}

    c_funcs = set()
    for f in files:
        if re.fullmatch(r"src/[^/]+\.c", f):
            c_funcs |= set(re.findall(r"^([A-Za-z_]\w*)\(", read(f), re.M))
    sql_funcs = set()
    for f in files:
        if re.fullmatch(r"sql/parts/[^/]+\.sql|contrib/plproxy/[^/]+\.sql", f):
            sql_funcs |= {m.lower() for m in re.findall(
                r"(?i)CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|AGGREGATE|PROCEDURE)\s+(?:\w+\.)?\"?(\w+)\"?",
                read(f))}
    targets = make_targets()

    def file_exists(name):
        if name in built or name in NOT_FILES:
            return True
        if "/" in name:
            path = name.rstrip("/")
            if any(c in path for c in "*?["):
                return any(fnmatch.fnmatch(f, path) or fnmatch.fnmatch(f, "*/" + path) for f in files)
            return path in dirs or os.path.exists(os.path.join(ROOT, path)) or \
                any(fnmatch.fnmatch(f, "*/" + path) for f in files)
        if any(c in name for c in "*?["):
            return any(fnmatch.fnmatch(b, name) for b in basenames)
        return name in basenames

    problems = []
    for doc in docs:
        text = read(doc)

        def line_of(pos):
            return text.count("\n", 0, pos) + 1

        def problem(pos, what):
            problems.append("%s:%d: %s" % (doc, line_of(pos), what))

        for m in re.finditer(r"`([^`\n]+)`", text):
            tok, pos = m.group(1).strip(), m.start()
            fm = re.fullmatch(r"([A-Za-z_]\w*)\(([\w, ]*)\)", tok)
            mm = re.fullmatch(r"make ([\w.-]+)(?: .*)?", tok)
            if mm:
                if mm.group(1) not in targets:
                    problem(pos, "`%s`: the Makefile has no target %s" % (tok, mm.group(1)))
            elif fm:
                name = fm.group(1)
                if name not in c_funcs and name.lower() not in sql_funcs:
                    problem(pos, "`%s`: no function %s in src/*.c, sql/parts or contrib/plproxy" % (tok, name))
            elif re.fullmatch(r"[\w.*/-]+" + FILE_EXT + r"|[\w.*-]*/[\w.*/-]*|[\w]+(?:-[\w]+)+", tok) \
                    and not tok.startswith("."):
                if not file_exists(tok):
                    problem(pos, "`%s`: no such file in the tree" % tok)
            elif re.fullmatch(r"flagmeter\.\w+", tok):
                # a SQL object or a setting: as the code writes it
                if tok not in words:
                    problem(pos, "`%s`: named nowhere in %s" % (tok, ", ".join(CODE_DIRS)))
            elif re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", tok):
                # an identifier, or a struct's field (FmLimit.pool)
                if any(p not in words for p in tok.split(".")):
                    problem(pos, "`%s`: named nowhere in %s" % (tok, ", ".join(CODE_DIRS)))

        for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            target = m.group(1)
            if re.match(r"\w+:", target):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target))
            if not os.path.exists(os.path.join(ROOT, path)):
                problem(m.start(), "link to %s: no such file" % target)

        # the tables cover the tree
        if os.path.basename(doc) == "architecture.md":
            rows = set(re.findall(r"^\|\s*`([^`]+)`\s*\|", text, re.M))
            for f in sorted(files):
                if re.fullmatch(r"src/[^/]+\.c|sql/parts/[^/]+\.sql", f) and os.path.basename(f) not in rows:
                    problems.append("%s: %s has no row in the tables of its directory" % (doc, f))

    # paths the code's comments cite
    cited = re.compile(r"(?<![\w/.$-])((?:%s)/[\w*.\[\]/-]*[\w*/\]])" % "|".join(TOP_DIRS))
    for f in sorted(files):
        if f.split("/")[0] not in COMMENT_DIRS or f.startswith("tools/check_docs_map") \
                or not re.search(r"\.(?:c|h|sql|sh|pl|py|mk)$|(^|/)[^./]+$", f):
            continue
        for n, line in enumerate(read(f).split("\n"), 1):
            if line.lstrip().startswith("#include"):
                continue
            for m in cited.finditer(line):
                if not file_exists(m.group(1).rstrip(".")):
                    problems.append("%s:%d: cites %s, which is not in the tree" % (f, n, m.group(1)))

    for p in problems:
        print(p)
    if problems:
        print("%d stale or missing name%s in %s or the comments of %s"
              % (len(problems), "" if len(problems) == 1 else "s", ", ".join(docs), ", ".join(COMMENT_DIRS)))
        return 1
    print("docs map: every file, function and name of %s, every path the comments of %s cite, exists"
          % (", ".join(docs), ", ".join(COMMENT_DIRS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
