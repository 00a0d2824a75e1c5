"""A generated German->English parallel corpus: the kit's embedded default data.

No download, fully deterministic (``random.Random(seed)``), and rich enough that a small GPT-2 has real rules to
learn, so its loss falls visibly (the constructions: ``_sentence``). Each example has the IWSLT layout
``{"translation": {"de": ..., "en": ...}}``.
"""
from __future__ import annotations

import random

# (gender, singular, plural, english singular, english plural)
NOUNS = [
    ("m", "Hund", "Hunde", "dog", "dogs"), ("m", "Mann", "Männer", "man", "men"),
    ("m", "Vater", "Väter", "father", "fathers"), ("m", "Lehrer", "Lehrer", "teacher", "teachers"),
    ("m", "Apfel", "Äpfel", "apple", "apples"), ("m", "Tisch", "Tische", "table", "tables"),
    ("m", "Brief", "Briefe", "letter", "letters"), ("m", "Vogel", "Vögel", "bird", "birds"),
    ("m", "Freund", "Freunde", "friend", "friends"), ("m", "Baum", "Bäume", "tree", "trees"),
    ("m", "Stuhl", "Stühle", "chair", "chairs"), ("m", "Schlüssel", "Schlüssel", "key", "keys"),
    ("m", "Onkel", "Onkel", "uncle", "uncles"), ("m", "Ball", "Bälle", "ball", "balls"),
    ("f", "Katze", "Katzen", "cat", "cats"), ("f", "Frau", "Frauen", "woman", "women"),
    ("f", "Mutter", "Mütter", "mother", "mothers"), ("f", "Schwester", "Schwestern", "sister", "sisters"),
    ("f", "Blume", "Blumen", "flower", "flowers"), ("f", "Tür", "Türen", "door", "doors"),
    ("f", "Lampe", "Lampen", "lamp", "lamps"), ("f", "Zeitung", "Zeitungen", "newspaper", "newspapers"),
    ("f", "Tasche", "Taschen", "bag", "bags"), ("f", "Ärztin", "Ärztinnen", "doctor", "doctors"),
    ("f", "Orange", "Orangen", "orange", "oranges"), ("f", "Uhr", "Uhren", "clock", "clocks"),
    ("n", "Kind", "Kinder", "child", "children"), ("n", "Buch", "Bücher", "book", "books"),
    ("n", "Haus", "Häuser", "house", "houses"), ("n", "Pferd", "Pferde", "horse", "horses"),
    ("n", "Fenster", "Fenster", "window", "windows"), ("n", "Bild", "Bilder", "picture", "pictures"),
    ("n", "Glas", "Gläser", "glass", "glasses"), ("n", "Mädchen", "Mädchen", "girl", "girls"),
    ("n", "Boot", "Boote", "boat", "boats"), ("n", "Ei", "Eier", "egg", "eggs"),
]
# nouns that can see, buy, give ... (subjects); all nouns can be objects
ANIMATE = {"dog", "man", "father", "teacher", "bird", "friend", "uncle", "cat", "woman", "mother",
           "sister", "doctor", "child", "horse", "girl"}

ADJECTIVES = [("klein", "small"), ("groß", "big"), ("alt", "old"), ("jung", "young"), ("rot", "red"),
              ("schnell", "fast"), ("neu", "new"), ("schön", "beautiful"), ("laut", "loud"),
              ("warm", "warm"), ("kalt", "cold"), ("grün", "green"), ("blau", "blue"), ("müde", "tired")]

# (infinitive, du-form, er-form, participle, en base, en 3sg, en past, en participle)
VERBS = [
    ("sehen", "siehst", "sieht", "gesehen", "see", "sees", "saw", "seen"),
    ("kaufen", "kaufst", "kauft", "gekauft", "buy", "buys", "bought", "bought"),
    ("lesen", "liest", "liest", "gelesen", "read", "reads", "read", "read"),
    ("finden", "findest", "findet", "gefunden", "find", "finds", "found", "found"),
    ("suchen", "suchst", "sucht", "gesucht", "look for", "looks for", "looked for", "looked for"),
    ("tragen", "trägst", "trägt", "getragen", "carry", "carries", "carried", "carried"),
    ("malen", "malst", "malt", "gemalt", "paint", "paints", "painted", "painted"),
    ("hören", "hörst", "hört", "gehört", "hear", "hears", "heard", "heard"),
    ("brauchen", "brauchst", "braucht", "gebraucht", "need", "needs", "needed", "needed"),
    ("öffnen", "öffnest", "öffnet", "geöffnet", "open", "opens", "opened", "opened"),
    ("waschen", "wäschst", "wäscht", "gewaschen", "wash", "washes", "washed", "washed"),
    ("holen", "holst", "holt", "geholt", "fetch", "fetches", "fetched", "fetched"),
    ("besuchen", "besuchst", "besucht", "besucht", "visit", "visits", "visited", "visited"),
    ("lieben", "liebst", "liebt", "geliebt", "love", "loves", "loved", "loved"),
]
GIVE_VERBS = [
    ("geben", "gibst", "gibt", "gegeben", "give", "gives", "gave", "given"),
    ("zeigen", "zeigst", "zeigt", "gezeigt", "show", "shows", "showed", "shown"),
    ("bringen", "bringst", "bringt", "gebracht", "bring", "brings", "brought", "brought"),
]
# (german, english, contraction with "dem" or None)
PREPOSITIONS = [("in", "in", "im"), ("auf", "on", None), ("unter", "under", None), ("neben", "next to", None),
                ("mit", "with", None), ("hinter", "behind", None)]
# person: (german pronoun, english pronoun, person key)
PRONOUNS = [("ich", "I", "1s"), ("du", "you", "2s"), ("er", "he", "3s"), ("sie", "she", "3s"),
            ("wir", "we", "1p"), ("ihr", "you", "2p"), ("sie", "they", "3p")]
# fronted adverbs: (german, english, english position: "front" or "mid")
ADVERBS = [("Heute", "today", "front"), ("Jetzt", "now", "front"), ("Oft", "often", "mid"),
           ("Immer", "always", "mid"), ("Manchmal", "sometimes", "front")]
THINK_VERBS = [("weiß", "weißt", "weiß", "wissen", "wisst", "know", "knows"),
               ("glaube", "glaubst", "glaubt", "glauben", "glaubt", "think", "thinks"),
               ("sage", "sagst", "sagt", "sagen", "sagt", "say", "says")]
MODALS = [("will", "willst", "will", "wollen", "wollt", "want to", "wants to"),
          ("kann", "kannst", "kann", "können", "könnt", "can", "can")]

_DEF = {"nom": {"m": "der", "f": "die", "n": "das", "p": "die"},
        "acc": {"m": "den", "f": "die", "n": "das", "p": "die"},
        "dat": {"m": "dem", "f": "der", "n": "dem", "p": "den"}}
_INDEF = {"nom": {"m": "ein", "f": "eine", "n": "ein"},
          "acc": {"m": "einen", "f": "eine", "n": "ein"},
          "dat": {"m": "einem", "f": "einer", "n": "einem"}}
# adjective endings after the definite article (weak) / after ein, kein, mein (mixed) / no article (strong plural)
_WEAK = {"nom": {"m": "e", "f": "e", "n": "e", "p": "en"}, "acc": {"m": "en", "f": "e", "n": "e", "p": "en"},
         "dat": {"m": "en", "f": "en", "n": "en", "p": "en"}}
_MIXED = {"nom": {"m": "er", "f": "e", "n": "es", "p": "en"}, "acc": {"m": "en", "f": "e", "n": "es", "p": "en"},
          "dat": {"m": "en", "f": "en", "n": "en", "p": "en"}}
_STRONG_PLURAL = {"nom": "e", "acc": "e", "dat": "en"}


def _adj_form(stem: str, ending: str) -> str:
    return stem[:-1] + ending if stem.endswith("e") and ending.startswith("e") else stem + ending


class _Phrase:
    """A noun phrase in both languages plus what the verb must agree with."""

    def __init__(self, de: str, en: str, person: str):
        self.de, self.en, self.person = de, en, person


def _noun_phrase(rng: random.Random, case: str, animate: bool = False, determiner: str | None = None) -> _Phrase:
    pool = [n for n in NOUNS if n[3] in ANIMATE] if animate else NOUNS
    gender, sg, pl, en_sg, en_pl = rng.choice(pool)
    plural = rng.random() < 0.3
    kind = determiner or rng.choice(["def", "def", "indef", "mein"])
    adj = rng.choice(ADJECTIVES) if rng.random() < 0.45 else None
    key = "p" if plural else gender
    noun_de = pl if plural else sg
    if plural and case == "dat" and not noun_de.endswith(("n", "s")):
        noun_de += "n"
    noun_en = en_pl if plural else en_sg
    words_de, words_en = [], []
    if kind == "def":
        words_de.append(_DEF[case][key])
        words_en.append("the")
        ending = _WEAK[case][key] if adj else ""
    elif kind in ("mein", "kein"):
        stem = "mein" if kind == "mein" else "kein"
        art = stem + ("e" if plural else _INDEF[case][gender][3:]) if not (plural and case == "dat") else stem + "en"
        if plural and case == "acc":
            art = stem + "e"
        words_de.append(art)
        words_en.append("my" if kind == "mein" else "no")
        ending = _MIXED[case][key] if adj else ""
        if plural and adj:
            ending = "en"
    else:  # indefinite: "ein" in the singular, no article in the plural
        if not plural:
            words_de.append(_INDEF[case][gender])
        ending = (_MIXED[case][gender] if not plural else _STRONG_PLURAL[case]) if adj else ""
        if not plural:
            first = adj[1] if adj else noun_en
            words_en.append("an" if first[0] in "aeiou" else "a")
    if adj:
        words_de.append(_adj_form(adj[0], ending))
        words_en.append(adj[1])
    words_de.append(noun_de)
    words_en.append(noun_en)
    return _Phrase(" ".join(words_de), " ".join(words_en), "3p" if plural else "3s")


def _subject(rng: random.Random) -> _Phrase:
    if rng.random() < 0.3:
        de, en, person = rng.choice(PRONOUNS)
        return _Phrase(de, en, person)
    return _noun_phrase(rng, "nom", animate=True)


def _conj(verb: tuple, person: str) -> str:
    inf, du, er = verb[0], verb[1], verb[2]
    stem = inf[:-2] if inf.endswith("en") else inf[:-1]
    needs_e = stem.endswith(("t", "d")) or stem.endswith("n") and stem[-2] not in "aeiouhlr"
    return {"1s": stem + "e", "2s": du, "3s": er, "1p": inf, "3p": inf,
            "2p": stem + ("et" if needs_e else "t")}[person]


def _en_verb(verb: tuple, person: str) -> str:
    return verb[5] if person == "3s" else verb[4]


def _en_do(person: str) -> str:
    return "does" if person == "3s" else "do"


def _en_have(person: str) -> str:
    return "has" if person == "3s" else "have"


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _pp(rng: random.Random) -> _Phrase:
    de_prep, en_prep, contraction = rng.choice(PREPOSITIONS)
    obj = _noun_phrase(rng, "dat", determiner="def")
    de = f"{de_prep} {obj.de}"
    if contraction and obj.de.startswith("dem "):
        de = f"{contraction} {obj.de[4:]}"
    return _Phrase(de, f"{en_prep} {obj.en}", "")


def _sentence(rng: random.Random) -> tuple[str, str]:
    """One (German, English) pair from a randomly chosen construction.

    The constructions: gender/case/number agreement of articles and adjectives (``der kleine Hund`` / ``den kleinen
    Hund`` / ``dem kleinen Hund``), ``a`` vs ``an``, dative plural ``-n`` (``mit den Kindern``); verb conjugation with
    stem changes (``ich sehe``, ``er sieht``) and its English counterpart (``I see``, ``he sees``); German word order:
    verb second after a fronted adverb (``Heute sieht der Hund ...`` -> ``Today the dog sees ...``), verb last in
    ``dass`` clauses, participles and infinitives at the end (``hat ... gesehen`` -> ``has seen``; ``will ... sehen``
    -> ``wants to see``), questions by inversion (``Sieht der Hund ...?`` -> ``Does the dog see ...?``), negation
    (``nicht`` -> ``does not``; ``kein`` -> ``no``), ``gestern`` + perfect -> English simple past.
    """
    kind = rng.choices(["svo", "adverb", "perfect", "yesterday", "negation", "kein", "dass", "give",
                        "question", "modal"], weights=[4, 2, 2, 1, 1, 1, 2, 2, 1, 2])[0]
    subj = _subject(rng)
    if kind == "give":
        de, en = _give(rng, subj)
        return _cap(de) + " .", _cap(en) + " ."
    verb = rng.choice(VERBS)
    obj = _noun_phrase(rng, "acc", determiner="kein" if kind == "kein" else None)
    pp = _pp(rng) if kind in ("svo", "adverb", "perfect") and rng.random() < 0.4 else None
    de, en = _CONSTRUCTIONS[kind](rng, subj, verb, obj, pp)
    end = " ?" if kind == "question" else " ."
    return _cap(de) + end, _cap(en) + end


def _give(rng: random.Random, subj: _Phrase) -> tuple[str, str]:
    """A giving verb with a dative (animate) and an accusative object: ``er gibt dem Mann einen Apfel``."""
    verb, p = rng.choice(GIVE_VERBS), subj.person
    dat = _noun_phrase(rng, "dat", animate=True)
    acc = _noun_phrase(rng, "acc")
    return (f"{subj.de} {_conj(verb, p)} {dat.de} {acc.de}", f"{subj.en} {_en_verb(verb, p)} {dat.en} {acc.en}")


# Each construction of a transitive verb (``_CONSTRUCTIONS``): (rng, subject, verb, accusative object, prepositional
# phrase or None) -> (German, English), neither capitalised nor punctuated; those that take no prepositional phrase
# get None.
def _tails(pp: _Phrase | None) -> tuple[str, str]:
    """The (German, English) ending a prepositional phrase adds: `` im Garten`` / `` in the garden``, or nothing."""
    return (f" {pp.de}", f" {pp.en}") if pp else ("", "")


def _plain(rng: random.Random, subj: _Phrase, verb: tuple, obj: _Phrase, pp: _Phrase | None) -> tuple[str, str]:
    """Subject, verb, object: ``der Hund sieht den Ball`` (also with ``kein``: ``keinen Ball`` -> ``no ball``)."""
    p, (tail_de, tail_en) = subj.person, _tails(pp)
    return (f"{subj.de} {_conj(verb, p)} {obj.de}{tail_de}", f"{subj.en} {_en_verb(verb, p)} {obj.en}{tail_en}")


def _fronted_adverb(rng: random.Random, subj: _Phrase, verb: tuple, obj: _Phrase,
                    pp: _Phrase | None) -> tuple[str, str]:
    """Verb second after a fronted adverb: ``Heute sieht der Hund ...`` -> ``today the dog sees ...`` (or ``the
    dog often sees ...`` for an adverb English puts mid-sentence)."""
    p, (tail_de, tail_en) = subj.person, _tails(pp)
    adv_de, adv_en, where = rng.choice(ADVERBS)
    de = f"{adv_de} {_conj(verb, p)} {subj.de} {obj.de}{tail_de}"
    if where == "front":
        return de, f"{adv_en} {subj.en} {_en_verb(verb, p)} {obj.en}{tail_en}"
    return de, f"{subj.en} {adv_en} {_en_verb(verb, p)} {obj.en}{tail_en}"


def _perfect(rng: random.Random, subj: _Phrase, verb: tuple, obj: _Phrase, pp: _Phrase | None) -> tuple[str, str]:
    """The perfect, participle last: ``er hat den Ball gesehen`` -> ``he has seen the ball``."""
    p, (tail_de, tail_en) = subj.person, _tails(pp)
    return (f"{subj.de} {_conj(('haben', 'hast', 'hat'), p)} {obj.de}{tail_de} {verb[3]}",
            f"{subj.en} {_en_have(p)} {verb[7]} {obj.en}{tail_en}")


def _yesterday(rng: random.Random, subj: _Phrase, verb: tuple, obj: _Phrase, pp: None) -> tuple[str, str]:
    """``gestern`` + perfect, verb second -> English simple past: ``Gestern hat er ... gesehen`` -> ``yesterday he
    saw ...``."""
    p = subj.person
    return (f"Gestern {_conj(('haben', 'hast', 'hat'), p)} {subj.de} {obj.de} {verb[3]}",
            f"yesterday {subj.en} {verb[6]} {obj.en}")


def _negation(rng: random.Random, subj: _Phrase, verb: tuple, obj: _Phrase, pp: None) -> tuple[str, str]:
    """``nicht`` after a definite or possessive object (drawn afresh): ``er sieht den Ball nicht`` -> ``he does not
    see the ball``."""
    p = subj.person
    obj = _noun_phrase(rng, "acc", determiner=rng.choice(["def", "mein"]))
    return f"{subj.de} {_conj(verb, p)} {obj.de} nicht", f"{subj.en} {_en_do(p)} not {verb[4]} {obj.en}"


def _dass_clause(rng: random.Random, subj: _Phrase, verb: tuple, obj: _Phrase, pp: None) -> tuple[str, str]:
    """Verb last in a ``dass`` clause: ``ich weiß , dass er den Ball sieht`` -> ``I know that he sees the ball``."""
    p = subj.person
    think = rng.choice(THINK_VERBS)
    head_de, head_en, head_p = rng.choice(PRONOUNS)
    forms = {"1s": think[0], "2s": think[1], "3s": think[2], "1p": think[3], "3p": think[3], "2p": think[4]}
    return (f"{head_de} {forms[head_p]} , dass {subj.de} {obj.de} {_conj(verb, p)}",
            f"{head_en} {think[6] if head_p == '3s' else think[5]} that {subj.en} {_en_verb(verb, p)} {obj.en}")


def _question(rng: random.Random, subj: _Phrase, verb: tuple, obj: _Phrase, pp: None) -> tuple[str, str]:
    """A question by inversion: ``sieht der Hund den Ball`` -> ``does the dog see the ball``."""
    p = subj.person
    return f"{_conj(verb, p)} {subj.de} {obj.de}", f"{_en_do(p)} {subj.en} {verb[4]} {obj.en}"


def _modal(rng: random.Random, subj: _Phrase, verb: tuple, obj: _Phrase, pp: None) -> tuple[str, str]:
    """A modal, infinitive last: ``er will den Ball sehen`` -> ``he wants to see the ball``."""
    p = subj.person
    modal = rng.choice(MODALS)
    forms = {"1s": modal[0], "2s": modal[1], "3s": modal[2], "1p": modal[3], "3p": modal[3], "2p": modal[4]}
    return (f"{subj.de} {forms[p]} {obj.de} {verb[0]}",
            f"{subj.en} {modal[6] if p == '3s' else modal[5]} {verb[4]} {obj.en}")


_CONSTRUCTIONS = {"svo": _plain, "kein": _plain, "adverb": _fronted_adverb, "perfect": _perfect,
                  "yesterday": _yesterday, "negation": _negation, "dass": _dass_clause, "question": _question,
                  "modal": _modal}


def generate_pairs(n: int, seed: int = 0) -> list[dict]:
    """Return ``n`` examples ``{"translation": {"de": str, "en": str}}``, the same for the same ``(n, seed)``.

    Uses only its own ``random.Random(seed)``; raises ValueError when ``n < 0``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        de, en = _sentence(rng)
        pairs.append({"translation": {"de": de, "en": en}})
    return pairs
