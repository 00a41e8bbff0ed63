"""Glossary terms agree with their sentence: the words around a substituted term take its gender and number.

The sentences here are held out: none of them (nor their terms) was used while agreement.py was written (it was
tuned on the issue's "Fui al orilla." / "El orilla del río es verde." / "El junta" / "El sede" and a handful of
others). Each case is what an MT engine leaves around a placeholder, then the term the glossary puts there; the
expected text is the grammatical one. The end-to-end tests run the real CLI with a glossary file.

Honest record of the first run of this set: 15 of 16 held-out sentences passed; "Aquest [900] és molt car." came
out "... és molta car." (Catalan "molt" is an adjective as well as an adverb), which changed the general rule (an
adverb before a predicate adjective is skipped only when an adjective follows it), not this case alone; and one
end-to-end expectation guessed Apertium's wording wrongly ("about" -> "aproximadament"), so it now checks the
agreement itself ("la vella casa").
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import BIN

from lingua_fusion.agreement import agree

pytestmark = pytest.mark.skipif(shutil.which("lt-proc") is None, reason="needs Apertium's lt-proc (make setup)")

HELD_OUT = [
    # Spanish: demonstratives, indefinites, contractions, plurals, adjectives before/after, copula + adjective,
    # and feminine -> masculine
    ("es", "Este [900] es muy caro.", "furgoneta", "Esta furgoneta es muy cara."),
    ("es", "Compré un [900] rojo.", "bicicleta", "Compré una bicicleta roja."),
    ("es", "Hablamos del [900] pequeño.", "empresa", "Hablamos de la empresa pequeña."),
    ("es", "Los [900] nuevos llegaron.", "cajas", "Las cajas nuevas llegaron."),
    ("es", "La [900] está abierta.", "museo", "El museo está abierto."),
    # Catalan: elision before a vowel through the contraction ("del" -> "de l'")
    ("ca", "Aquest [900] és molt car.", "bicicleta", "Aquesta bicicleta és molt cara."),
    ("ca", "Parlem del [900] petit.", "empresa", "Parlem de l'empresa petita."),
    ("ca", "Un [900] vermell.", "taula", "Una taula vermella."),
    # French: ce/cette, du -> de la, le -> l' before a vowel, irregular feminines
    ("fr", "Ce [900] est très cher.", "voiture", "Cette voiture est très chère."),
    ("fr", "Nous parlons du [900] blanc.", "maison", "Nous parlons de la maison blanche."),
    ("fr", "Un [900] noir.", "table", "Une table noire."),
    ("fr", "Le [900] est ouvert.", "entreprise", "L'entreprise est ouverte."),
    # Portuguese: do -> da, no -> na, um -> uma
    ("pt", "Este [900] é muito caro.", "bicicleta", "Esta bicicleta é muito cara."),
    ("pt", "Falamos do [900] pequeno.", "empresa", "Falamos da empresa pequena."),
    ("pt", "Um [900] vermelho.", "mesa", "Uma mesa vermelha."),
    ("pt", "Vivemos no [900] antigo.", "casa", "Vivemos na casa antiga."),
]


@pytest.mark.parametrize(("lang", "mt_output", "term", "expected"), HELD_OUT,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(HELD_OUT)])
def test_a_term_agrees_with_its_sentence(lang: str, mt_output: str, term: str, expected: str) -> None:
    assert agree(mt_output, "[900]", term) == expected


@pytest.mark.parametrize(("mt_output", "term", "expected"), [
    ("The [900] is new.", "sede", "The sede is new."),  # English: nothing to agree
    ("Der [900] ist neu.", "Bank", "Der Bank ist neu."),  # German has no dictionary here: left as it was
    ("El [900] es nuevo.", "Xyzzyplex", "El Xyzzyplex es nuevo."),  # an unknown term: no gender, no change
    ("Vimos [900] y [901].", "Acme", "Vimos Acme y [901]."),  # a name with no article; other placeholders stay
])
def test_no_change_without_a_reason(mt_output: str, term: str, expected: str) -> None:
    assert agree(mt_output, "[900]", term) == expected


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=300)


def test_readme_glossary_example_through_the_cli(tmp_path: Path) -> None:
    """The documented example (docs/models.md, Glossaries; the README's SDK snippet uses the same term), the way a
    user runs it: the CLI with a glossary file, rule-based en -> es."""
    gloss = tmp_path / "terms.json"
    gloss.write_text(json.dumps({"bank": "orilla", "board": "junta", "headquarters": "sede"}))
    p = _cli("translate", "--text", "I went to the bank. The bank of the river is green.", "--from", "en",
             "--to", "es", "--glossary", str(gloss))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "Fui a la orilla. La orilla del río es verde."


@pytest.mark.parametrize(("to", "text", "terms", "wanted", "unwanted"), [
    # held out as well: other sentences and terms, through real MT (Apertium en -> es / ca, fr via es)
    ("es", "The new office is closed today.", {"office": "oficina"}, ["La nueva oficina", "cerrada"],
     ["El nuevo oficina", "cerrado"]),
    ("ca", "We talked about the old building.", {"building": "casa"}, ["la vella casa"], ["el vell casa"]),
    ("fr", "The small shop is open.", {"shop": "boutique"}, ["boutique"], ["Le petit boutique"]),
])
def test_agreement_through_real_mt(to: str, text: str, terms: dict[str, str], wanted: list[str],
                                   unwanted: list[str], tmp_path: Path) -> None:
    gloss = tmp_path / "terms.json"
    gloss.write_text(json.dumps(terms))
    p = _cli("translate", "--text", text, "--from", "en", "--to", to, "--glossary", str(gloss), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)["text"]
    for w in wanted:
        assert w.lower() in out.lower(), out
    for u in unwanted:
        assert u.lower() not in out.lower(), out
