#!/usr/bin/env python3
"""tools/run_doc_examples.py [FILE.md...] -- the docs' SQL examples, run.

For each guide and reference page (docs/guides/*.md, docs/reference/*.md,
or the files named), its ```sql blocks run in order, in one psql session
with ON_ERROR_STOP, in a fresh database of their own (fm_doc_<name>) where
`CREATE EXTENSION flagmeter` ran first; the database is dropped afterwards.
The server is the one PGHOST, PGPORT and PGUSER name (a superuser: make
test's cluster over TCP, suite doc_examples of tools/test.sh).

A block that cannot run on its own (it needs PL/Proxy shards, pg_cron, a
role or table the example assumes...) is skipped by a marker on the last
non-blank line before its fence, which gives the reason:

    <!-- not run: needs PL/Proxy shards -->

A marker without a reason, or one that is not followed by a ```sql block,
is an error, so that every skip says why.

The script psql reads keeps each block's lines at their line numbers in
the Markdown file (every other line blank), so the line psql names in an
error is the file's: a failure is reported as FILE:LINE with the block it
is in.  A block must end its last statement with ';' (or a psql
meta-command), or it would run together with the next block.

Exit status 0 when every file ran to the end, 1 otherwise; the last line
says how many files and blocks ran, were skipped and failed.
"""

import difflib
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r'^\s*<!--\s*not run\s*(?::\s*(.*?))?\s*-->\s*$')
FENCE_SQL = re.compile(r'^```sql\s*$')
FENCE = re.compile(r'^```')
HIDDEN_START = re.compile(r'^\s*<!--\s*run, not shown:.*$')
HIDDEN_END = re.compile(r'^\s*-->\s*$')
SIGNATURE = re.compile(r'^flagmeter\.(aggregate )?\w+\(.*\)( → .+)?$')
CREATES = re.compile(r'^\s*CREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?flagmeter\s*;', re.I | re.M)


class Block:
    def __init__(self, start):
        self.start = start      # line number of the opening fence (1-based)
        self.end = None         # line number of the closing fence
        self.lines = []         # (line number, text)
        self.skip = None        # reason, when marked not run
        self.hidden = False     # a "run, not shown" comment, not a fence
        self.expected = None    # the lines of a bare ``` block right after it

    def expects_error(self):
        return bool(self.expected) and self.expected[0].startswith('ERROR:')

    def is_signature(self):
        """A reference entry's signature, not an example: every line is
        `flagmeter.f(args) → type` (or a function with OUT arguments)."""
        text = [line for _, line in self.lines if line.strip()]
        return bool(text) and all(SIGNATURE.match(line) for line in text)


def parse(path):
    """The ```sql blocks of PATH, and the marker errors found."""
    blocks, errors = [], []
    with open(path, encoding='utf-8') as f:
        text = f.read().split('\n')
    block = None
    other_fence = False
    pending = None              # (line, reason) of a marker not yet used
    output = None               # the bare ``` block right after a sql block
    for n, line in enumerate(text, 1):
        if output is not None:
            if FENCE.match(line):
                output = None
            else:
                output.append(line)
            continue
        if block is None and blocks and not other_fence and line == '```' \
                and blocks[-1].end == n - 1 and not blocks[-1].hidden:
            blocks[-1].expected = output = []
            continue
        if block is not None:
            if (HIDDEN_END if block.hidden else FENCE).match(line):
                block.end = n
                blocks.append(block)
                block = None
            else:
                block.lines.append((n, line))
            continue
        if other_fence:
            if FENCE.match(line):
                other_fence = False
            continue
        if HIDDEN_START.match(line):
            block = Block(n)
            block.hidden = True
            if pending:
                errors.append('%s:%d: "not run" marker before a "run, not shown" comment'
                              % (path, pending[0]))
                pending = None
            continue
        if FENCE_SQL.match(line):
            block = Block(n)
            if pending:
                block.skip = pending[1]
                pending = None
            continue
        if FENCE.match(line):
            other_fence = True
            if pending:
                errors.append('%s:%d: "not run" marker before a block that is not ```sql'
                              % (path, pending[0]))
                pending = None
            continue
        m = MARKER.match(line)
        if m:
            if not m.group(1):
                errors.append('%s:%d: "not run" marker without a reason '
                              '(<!-- not run: why -->)' % (path, n))
            pending = (n, m.group(1) or '')
            continue
        if line.strip() and pending:
            errors.append('%s:%d: "not run" marker not right before a ```sql block'
                          % (path, pending[0]))
            pending = None
    if block is not None:
        errors.append('%s:%d: ```sql block never closed' % (path, block.start))
    if pending:
        errors.append('%s:%d: "not run" marker at the end of the file' % (path, pending[0]))
    return blocks, errors, len(text)


def ends_statement(block):
    """True when the block's last SQL line ends a statement."""
    for _, line in reversed(block.lines):
        s = re.sub(r'--.*$', '', line).strip()
        if not s:
            continue
        return s.endswith(';') or s.startswith('\\')
    return True                 # only comments


RESULT_DIFFS = []


def normalize(lines):
    """A result as psql prints it, without trailing blanks, blank lines
    and the row count footer."""
    return [line.rstrip() for line in lines
            if line.strip() and not re.match(r'^\(\d+ rows?\)$', line.strip())]


def psql(*args, **kw):
    return subprocess.run(['psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1'] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, **kw)


def run_file(path, workdir):
    """(blocks run, skipped, signatures, failure message or None) for PATH."""
    rel = os.path.relpath(path, ROOT)
    blocks, errors, nlines = parse(path)
    signatures = [b for b in blocks if b.skip is None and not b.hidden and b.is_signature()]
    run = [b for b in blocks if b.skip is None and b not in signatures]
    skipped = len(blocks) - len(run) - len(signatures)
    for b in run:
        if not ends_statement(b):
            errors.append('%s:%d: the block starting here does not end its last statement '
                          'with ";"' % (rel, b.start))
    if errors:
        return 0, skipped, len(signatures), '\n'.join(errors)
    if not run:
        return 0, skipped, len(signatures), None

    # Each block's lines at their line numbers; on its fence lines, psql
    # meta-commands: a block whose shown output is an ERROR runs with
    # ON_ERROR_STOP off, one with a shown result has its output in a file.
    script = [''] * nlines
    for b in run:
        for n, line in b.lines:
            script[n - 1] = line
        if b.hidden or b.expected is None:
            continue
        if b.expects_error():
            script[b.start - 1] = '\\set ON_ERROR_STOP 0'
            script[b.end - 1] = '\\set ON_ERROR_STOP 1'
        else:
            script[b.start - 1] = '\\o %s' % os.path.join(workdir, 'out_%d' % b.start)
            script[b.end - 1] = '\\o'
    sql = os.path.join(workdir, rel.replace('/', '_') + '.sql')
    with open(sql, 'w', encoding='utf-8') as f:
        f.write('\n'.join(script) + '\n')

    db = 'fm_doc_' + re.sub(r'[^a-z0-9]+', '_', rel[len('docs/'):-len('.md')].lower()
                            if rel.startswith('docs/') else rel.lower())
    roles = psql('-d', 'postgres', '-At', '-c', 'SELECT rolname FROM pg_roles').stdout.split()
    r = psql('-d', 'postgres', '-c', 'DROP DATABASE IF EXISTS %s WITH (FORCE)' % db,
             '-c', 'CREATE DATABASE %s' % db)
    if r.returncode != 0:
        return 0, skipped, len(signatures), '%s: could not create database %s:\n%s' % (rel, db, r.stdout)
    try:
        creates = any(CREATES.search('\n'.join(line for _, line in b.lines)) for b in run)
        r = psql('-d', db, '-c', 'SELECT 1' if creates else 'CREATE EXTENSION flagmeter')
        if r.returncode != 0:
            return 0, skipped, len(signatures), '%s: CREATE EXTENSION flagmeter failed:\n%s' % (rel, r.stdout)
        # the script's name in psql's messages is the Markdown file's
        r = psql('-d', db, '-f', sql, cwd=workdir)
        out = r.stdout.replace(sql, rel)
        errors_at = {}          # line -> first line of the error psql reported there
        for m in re.finditer(r'^psql:%s:(\d+): ((?:ERROR|FATAL|error):.*)$' % re.escape(rel),
                             out, re.M):
            errors_at.setdefault(int(m.group(1)), m.group(2))
        if r.returncode != 0:
            if errors_at:
                line = max(errors_at)
                where = next((b for b in run if b.start < line <= b.end), None)
                head = '%s:%d: error in the ```sql block of line %d' % (
                    rel, line, where.start if where else 0)
                tail = out[out.index('psql:%s:%d: ' % (rel, line)):]
            else:
                head = '%s: psql failed (exit status %d)' % (rel, r.returncode)
                tail = out
            return len(run), skipped, len(signatures), head + '\n' + '\n'.join(
                tail.rstrip().split('\n')[:12])
        failures = []
        for b in run:
            if b.expected is None or b.hidden:
                continue
            if b.expects_error():
                want = re.sub(r'\s+', ' ', b.expected[0]).strip()
                got = [re.sub(r'\s+', ' ', e).strip() for n, e in errors_at.items()
                       if b.start < n < b.end]
                if want not in got:
                    failures.append('%s:%d: the block shows\n    %s\n  psql said\n    %s' % (
                        rel, b.start, want, '\n    '.join(got) or '(no error)'))
                continue
            with open(os.path.join(workdir, 'out_%d' % b.start), encoding='utf-8') as f:
                got = normalize(f.read().split('\n'))
            want = normalize(b.expected)
            got = got[-len(want):] if want else got
            if got != want:
                RESULT_DIFFS.append('%s:%d: the result shown differs from the one psql printed:\n%s'
                                    % (rel, b.start, '\n'.join(difflib.unified_diff(
                                        normalize(b.expected), got, 'shown', 'printed',
                                        lineterm='', n=1))))
        if failures:
            return len(run), skipped, len(signatures), '\n'.join(failures)
        return len(run), skipped, len(signatures), None
    finally:
        # roles are the cluster's: drop those the examples created
        psql('-d', 'postgres', '-c', 'DROP DATABASE IF EXISTS %s WITH (FORCE)' % db)
        for role in psql('-d', 'postgres', '-At', '-c', 'SELECT rolname FROM pg_roles').stdout.split():
            if role not in roles:
                psql('-d', 'postgres', '-c', 'DROP ROLE "%s"' % role.replace('"', '""'))


def main(argv):
    files = argv or sorted(glob.glob(os.path.join(ROOT, 'docs/guides/*.md')) +
                           glob.glob(os.path.join(ROOT, 'docs/reference/*.md')))
    files = [os.path.abspath(f) for f in files]
    total_run = total_skipped = total_signatures = 0
    failed = []
    with tempfile.TemporaryDirectory(prefix='fm-doc-examples.') as workdir:
        os.chmod(workdir, 0o755)
        for path in files:
            rel = os.path.relpath(path, ROOT)
            n_run, n_skipped, n_signatures, failure = run_file(path, workdir)
            total_signatures += n_signatures
            total_run += n_run
            total_skipped += n_skipped
            if failure:
                failed.append(rel)
                print('FAILED  %s\n%s' % (rel, failure), flush=True)
            elif n_run or n_skipped:
                print('ok      %s: %d sql blocks run, %d not run, %d signatures'
                      % (rel, n_run, n_skipped, n_signatures),
                      flush=True)
    for note in RESULT_DIFFS:
        print('note    %s' % note)
    print('%d files: %d sql blocks run, %d not run (marked), %d signatures, %d results differ (notes), %d files failed%s'
          % (len(files), total_run, total_skipped, total_signatures, len(RESULT_DIFFS), len(failed),
             (': ' + ', '.join(failed)) if failed else ''))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
