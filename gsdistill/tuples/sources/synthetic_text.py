"""Readable pseudo-text for synthetic pages: topic vocabularies and sentence templates.

Each synthetic document draws a main topic, so pages of different documents differ in meaning
(what the frozen text encoder sees), while pages of one document stay on one subject.
"""
from __future__ import annotations

import random

TOPICS: dict[str, dict[str, list[str]]] = {
    "physics": {"n": "particle field energy lattice photon electron spectrum detector magnet plasma "
                     "momentum wave crystal laser quantum state resonance temperature".split(),
                "v": "scatters absorbs emits measures excites cools deflects polarises".split(),
                "a": "thermal nuclear optical magnetic coherent cryogenic relativistic dense".split()},
    "biology": {"n": "cell protein gene enzyme membrane tissue receptor neuron bacterium genome "
                     "mutation species organism pathway antibody mitochondria".split(),
                "v": "regulates expresses binds encodes inhibits signals divides transports".split(),
                "a": "cellular genetic metabolic immune neural microbial viral molecular".split()},
    "finance": {"n": "market bond equity portfolio dividend inflation rate investor asset credit "
                     "liquidity yield currency risk budget revenue".split(),
                "v": "hedges values lends borrows discounts allocates audits trades".split(),
                "a": "fiscal monetary volatile quarterly corporate sovereign annual liquid".split()},
    "law": {"n": "court statute contract plaintiff defendant clause tribunal judgment treaty "
                 "liability evidence appeal regulation license verdict".split(),
            "v": "interprets enforces overturns drafts ratifies disputes binds litigates".split(),
            "a": "judicial statutory contractual criminal civil federal binding legal".split()},
    "computing": {"n": "algorithm compiler network server kernel database protocol processor "
                       "cache graph query thread memory encoder dataset model".split(),
                  "v": "compiles indexes schedules encrypts parses queries trains caches".split(),
                  "a": "parallel distributed recursive sparse efficient neural scalable binary".split()},
    "history": {"n": "empire dynasty treaty revolution monarchy archive manuscript colony war "
                     "parliament chronicle settlement trade republic".split(),
                "v": "conquers founds records abolishes unifies negotiates rebels reforms".split(),
                "a": "medieval ancient colonial imperial feudal maritime royal rural".split()},
    "cooking": {"n": "recipe dough sauce oven flavour spice broth pastry butter flour garlic "
                     "vinegar kitchen harvest herb".split(),
                "v": "bakes simmers roasts ferments seasons whisks grills kneads".split(),
                "a": "savory crisp tender smoky sweet aromatic rustic golden".split()},
    "geology": {"n": "rock sediment mineral fault volcano glacier basin erosion magma quartz "
                     "aquifer tectonic plate earthquake stratum".split(),
                "v": "erodes deposits fractures melts uplifts compresses weathers shifts".split(),
                "a": "sedimentary igneous volcanic alluvial seismic coastal arid crustal".split()},
    "astronomy": {"n": "galaxy star orbit telescope nebula comet planet quasar supernova halo "
                       "redshift cluster asteroid pulsar".split(),
                  "v": "orbits collapses observes accretes radiates eclipses expands rotates".split(),
                  "a": "stellar galactic cosmic lunar solar distant luminous binary".split()},
    "medicine": {"n": "patient therapy dose trial symptom diagnosis vaccine surgery clinic "
                      "infection tumour prescription recovery hospital".split(),
                 "v": "treats diagnoses prescribes monitors heals prevents screens relieves".split(),
                 "a": "clinical chronic acute surgical randomised oral cardiac pediatric".split()},
    "music": {"n": "melody chord rhythm orchestra sonata tempo harmony violin choir concert "
                   "score composer scale symphony".split(),
              "v": "composes performs tunes harmonises records improvises conducts arranges".split(),
              "a": "baroque melodic minor major acoustic choral lyrical tonal".split()},
    "agriculture": {"n": "crop soil irrigation yield harvest seed fertiliser pasture livestock "
                         "orchard drought wheat cattle greenhouse".split(),
                    "v": "irrigates plants harvests grazes rotates fertilises sows prunes".split(),
                    "a": "organic arable seasonal fertile rural sustainable irrigated dry".split()},
}
TOPIC_NAMES = sorted(TOPICS)

_TEMPLATES = [
    "The {a} {n} {v} the {n2} of the {n3}.",
    "In this study the {n} {v} a {a} {n2} under controlled conditions.",
    "We show that every {a} {n} {v} the {n2} faster than the {n3}.",
    "A {a} {n} rarely {v} the {n2}, although the {n3} remains {a2}.",
    "Earlier work on the {n} suggests that the {n2} {v} the {a} {n3}.",
    "Our results indicate a {a} {n} that {v} each {n2} within the {n3}.",
    "When the {n} {v} the {n2}, the {a} {n3} changes as well.",
    "The {n2} of a {a} {n} is reported for {num} cases.",
]


class TextMaker:
    """Sentences, headings, captions, table cells and formulas about one topic, from a seeded RNG."""

    def __init__(self, rng: random.Random, topic: str):
        self.rng = rng
        self.topic = topic
        self.vocab = TOPICS[topic]

    def _fill(self, template: str) -> str:
        r, voc = self.rng, self.vocab
        return template.format(n=r.choice(voc["n"]), n2=r.choice(voc["n"]), n3=r.choice(voc["n"]),
                               v=r.choice(voc["v"]), a=r.choice(voc["a"]), a2=r.choice(voc["a"]),
                               num=r.randint(2, 999))

    def sentence(self) -> str:
        return self._fill(self.rng.choice(_TEMPLATES))

    def paragraph(self, n_sentences: int) -> str:
        return " ".join(self.sentence() for _ in range(n_sentences))

    def heading(self, numbered: str = "") -> str:
        words = [self.rng.choice(self.vocab["a"]).capitalize(), self.rng.choice(self.vocab["n"]).capitalize()]
        if self.rng.random() < 0.5:
            words += ["and", self.rng.choice(self.vocab["n"]).capitalize()]
        return (numbered + " " if numbered else "") + " ".join(words)

    def title(self) -> str:
        v = self.vocab
        return (f"On the {self.rng.choice(v['a']).capitalize()} {self.rng.choice(v['n']).capitalize()} "
                f"of {self.rng.choice(v['n']).capitalize()} {self.rng.choice(v['n']).capitalize()}s")

    def cell(self, header: bool) -> str:
        if header:
            return self.rng.choice(self.vocab["n"]).capitalize()
        return self.rng.choice([f"{self.rng.uniform(0, 100):.1f}", str(self.rng.randint(1, 999)),
                                self.rng.choice(self.vocab["a"])])

    def formula(self, unicode_ok: bool) -> str:
        r = self.rng
        var = r.choice("xyzukt")
        if unicode_ok:
            return r.choice([
                f"E({var}) = Σᵢ αᵢ {var}ᵢ² + β",
                f"∫₀^∞ f({var}) e^(−λ{var}) d{var} = F(λ)",
                f"∂u/∂t = κ ∇²u + σ({var})",
                f"p({var} | θ) = exp(−‖{var} − μ‖² / 2σ²)",
            ])
        return r.choice([
            f"E({var}) = sum_i a_i {var}_i^2 + b",
            f"int f({var}) exp(-L {var}) d{var} = F(L)",
            f"du/dt = k d2u/d{var}2 + s({var})",
            f"p({var} | t) = exp(-|{var} - m|^2 / 2s^2)",
        ])
