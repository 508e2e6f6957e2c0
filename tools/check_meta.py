#!/usr/bin/env python3
"""tools/check_meta.py [META.json] -- META.json against the PGXN Meta Spec
1.0.0 (https://pgxn.org/spec/): Debian packages no validator
(PGXN::Meta::Validator is on CPAN only), so this checks what the spec
requires and the formats it defines: name, abstract, maintainer, license,
provides (each extension with file and version), meta-spec 1.0.0; versions
semantic (x.y.z); prereqs as phase -> relation -> {name: version range};
resources, release_status, tags and no_index in their forms.  `make dist`
runs it; exit status 1 with one line per problem.
"""
import json
import re
import sys

SEMVER = re.compile(r'^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+)?$')
RANGE = re.compile(r'^\s*(?:(?:[<>]=?|==|!=)\s*)?(0|[1-9]\d*)(\.\d+){0,2}(-[0-9A-Za-z-]+)?\s*$')
LICENSES = {'agpl_3', 'apache_1_1', 'apache_2_0', 'artistic_1', 'artistic_2', 'bsd', 'freebsd',
            'gfdl_1_2', 'gfdl_1_3', 'gpl_1', 'gpl_2', 'gpl_3', 'lgpl_2_1', 'lgpl_3_0', 'mit',
            'mozilla_1_0', 'mozilla_1_1', 'openssl', 'perl_5', 'postgresql', 'qpl_1_0', 'ssleay',
            'sun', 'zlib', 'open_source', 'restricted', 'unrestricted', 'unknown'}
PHASES = {'configure', 'build', 'test', 'runtime', 'develop'}
RELATIONS = {'requires', 'recommends', 'suggests', 'conflicts'}
problems = []


def bad(msg):
    problems.append(msg)


def string(v):
    return isinstance(v, str) and v.strip() != ''


def check(meta):
    for key in ('name', 'abstract', 'maintainer', 'license', 'provides', 'meta-spec', 'version'):
        if key not in meta:
            bad('required key "%s" missing' % key)
    if 'name' in meta and not (string(meta['name']) and re.match(r'^[^\s/\\:]{2,}$', meta['name'])):
        bad('name must be 2 or more characters, no space, /, \\ or :')
    for key in ('abstract', 'description', 'generated_by'):
        if key in meta and not string(meta[key]):
            bad('%s must be a non-empty string' % key)
    if 'version' in meta and not (string(meta['version']) and SEMVER.match(meta['version'])):
        bad('version "%s" is not a semantic version (x.y.z)' % meta['version'])
    m = meta.get('maintainer')
    if m is not None and not (string(m) or (isinstance(m, list) and m and all(map(string, m)))):
        bad('maintainer must be a string or a non-empty list of strings')
    lic = meta.get('license')
    if lic is not None:
        ok = (isinstance(lic, str) and lic in LICENSES) or \
            (isinstance(lic, list) and lic and all(x in LICENSES for x in lic)) or \
            (isinstance(lic, dict) and lic and all(map(string, lic.values())))
        if not ok:
            bad('license "%s" is none of the spec\'s names (or a name -> URL object)' % (lic,))
    ms = meta.get('meta-spec')
    if ms is not None:
        if not isinstance(ms, dict) or ms.get('version') != '1.0.0':
            bad('meta-spec must be an object with "version": "1.0.0"')
    prov = meta.get('provides')
    if prov is not None:
        if not isinstance(prov, dict) or not prov:
            bad('provides must be a non-empty object')
        else:
            for ext, p in prov.items():
                if not isinstance(p, dict):
                    bad('provides.%s must be an object' % ext)
                    continue
                for key in ('file', 'version'):
                    if not string(p.get(key)):
                        bad('provides.%s.%s missing' % (ext, key))
                if string(p.get('version')) and not SEMVER.match(p['version']):
                    bad('provides.%s.version "%s" is not semantic' % (ext, p['version']))
                for key in p:
                    if key not in ('file', 'version', 'abstract', 'docfile') and not key.startswith('x_'):
                        bad('provides.%s: unknown key "%s"' % (ext, key))
    pre = meta.get('prereqs')
    if pre is not None:
        if not isinstance(pre, dict):
            bad('prereqs must be an object')
        else:
            for phase, rels in pre.items():
                if phase not in PHASES:
                    bad('prereqs: unknown phase "%s"' % phase)
                    continue
                for rel, deps in (rels or {}).items():
                    if rel not in RELATIONS:
                        bad('prereqs.%s: unknown relation "%s"' % (phase, rel))
                        continue
                    for name, rng in (deps or {}).items():
                        if not (rng == 0 or (isinstance(rng, str) and
                                             all(RANGE.match(part) for part in rng.split(',')))):
                            bad('prereqs.%s.%s.%s: "%s" is not a version range'
                                % (phase, rel, name, rng))
    res = meta.get('resources')
    if res is not None:
        if not isinstance(res, dict):
            bad('resources must be an object')
        else:
            for key in ('homepage',):
                if key in res and not string(res[key]):
                    bad('resources.%s must be a URL' % key)
            for key in ('bugtracker', 'repository'):
                if key in res and not (isinstance(res[key], dict) and
                                       all(map(string, res[key].values()))):
                    bad('resources.%s must be an object of strings' % key)
    if 'release_status' in meta and meta['release_status'] not in ('stable', 'testing', 'unstable'):
        bad('release_status must be stable, testing or unstable')
    if 'tags' in meta and not (isinstance(meta['tags'], list) and
                               all(string(t) and len(t) <= 255 for t in meta['tags'])):
        bad('tags must be a list of non-empty strings')
    if 'no_index' in meta and not isinstance(meta['no_index'], dict):
        bad('no_index must be an object')


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else 'META.json'
    try:
        with open(path, encoding='utf-8') as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        print('%s: %s' % (path, e))
        return 1
    check(meta)
    for p in problems:
        print('%s: %s' % (path, p))
    print('%s: %s' % (path, '%d problem(s) with the PGXN Meta Spec 1.0.0' % len(problems)
                      if problems else 'valid against the PGXN Meta Spec 1.0.0 (required keys and formats)'))
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
