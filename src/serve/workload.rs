//! The requests a serving run sends: arrival times (open-loop Poisson or constant rate, or a
//! closed loop of N clients), prompt and output lengths (fixed, uniform, or the XSum trace
//! shipped in `datasets/xsum`), and prompt tokens cut from real text. Seeded: the same seed
//! gives the same requests for every scheme, so schemes are compared on identical load (as
//! vLLM's `bench serve --seed` and GuideLLM do).

use std::str::FromStr;

use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};

/// How prompt or output lengths are drawn.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(into = "String")]
pub enum LenDist {
    /// Every request the same, tokens.
    Fixed(usize),
    /// Uniform over `lo..=hi` tokens.
    Uniform(usize, usize),
    /// The XSum test pairs' token lengths (article for prompts, reference summary for outputs;
    /// both from the same pair), measured with the model's tokenizer and clamped to `lo..=hi`.
    Xsum(usize, usize),
}

impl std::fmt::Display for LenDist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(n) => write!(f, "{n}"),
            Self::Uniform(a, b) => write!(f, "{a}..{b}"),
            Self::Xsum(a, b) => write!(f, "xsum:{a}..{b}"),
        }
    }
}

/// Longest prompt or output length `--input-len`/`--output-len` accept, tokens (2^24, past
/// every model's context): sums of lengths then never overflow, and a typo is refused before
/// anything is allocated.
pub const MAX_LEN_TOKENS: usize = 1 << 24;

impl FromStr for LenDist {
    type Err = Error;
    /// `256` (fixed), `128..512` (uniform, inclusive) or `xsum:32..512` (the shipped trace,
    /// clamped). Errors: [`Error::InvalidArgument`] listing the forms.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidArgument {
            name: "length".into(),
            reason: format!(
                "`{s}` is not a length like 256 (fixed), 128..512 (uniform) or xsum:32..512 \
                 (the XSum trace, clamped); lengths are at least 1 token"
            ),
        };
        let too_long = |n: usize| Error::InvalidArgument {
            name: "length".into(),
            reason: format!(
                "`{s}`: {n} tokens is past any model's context; lengths are at most \
                 {MAX_LEN_TOKENS} tokens"
            ),
        };
        let range = |t: &str| -> Result<(usize, usize)> {
            let (a, b) = t.split_once("..").ok_or_else(bad)?;
            let (a, b): (usize, usize) = (
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            );
            if a == 0 || b < a {
                return Err(bad());
            }
            if b > MAX_LEN_TOKENS {
                return Err(too_long(b));
            }
            Ok((a, b))
        };
        let t = s.trim();
        if let Some(r) = t.strip_prefix("xsum:") {
            let (a, b) = range(r)?;
            return Ok(Self::Xsum(a, b));
        }
        if t.contains("..") {
            let (a, b) = range(t)?;
            return Ok(Self::Uniform(a, b));
        }
        match t.parse::<usize>() {
            Ok(n) if n > MAX_LEN_TOKENS => Err(too_long(n)),
            Ok(n) if n > 0 => Ok(Self::Fixed(n)),
            _ => Err(bad()),
        }
    }
}

impl From<LenDist> for String {
    fn from(d: LenDist) -> String {
        d.to_string()
    }
}

impl<'de> serde::Deserialize<'de> for LenDist {
    /// The text form (`"128..384"`), or a whole number of tokens (a suite's `input-len = 256`);
    /// anything else is refused naming its type ("invalid type: boolean `true`").
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = LenDist;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a length like 256, 128..384 or xsum:64..512")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<LenDist, E> {
                s.parse().map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> std::result::Result<LenDist, E> {
                self.visit_str(&n.to_string())
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> std::result::Result<LenDist, E> {
                self.visit_str(&n.to_string())
            }
        }
        d.deserialize_any(V)
    }
}

impl LenDist {
    /// The longest length this can draw, tokens.
    pub fn max(&self) -> usize {
        match *self {
            Self::Fixed(n) => n,
            Self::Uniform(_, b) | Self::Xsum(_, b) => b,
        }
    }

    /// The mean length over the draws `lens` would produce (fixed, uniform by formula; the trace
    /// by averaging the clamped lengths).
    pub fn mean(&self, trace: &[usize]) -> f64 {
        match *self {
            Self::Fixed(n) => n as f64,
            Self::Uniform(a, b) => (a + b) as f64 / 2.0,
            Self::Xsum(a, b) => {
                trace.iter().map(|&n| n.clamp(a, b) as f64).sum::<f64>() / trace.len().max(1) as f64
            }
        }
    }

    fn draw(&self, rng: &mut impl Rng, trace: &[usize], pair: usize) -> usize {
        match *self {
            Self::Fixed(n) => n,
            Self::Uniform(a, b) => rng.random_range(a..=b),
            Self::Xsum(a, b) => trace[pair % trace.len()].clamp(a, b),
        }
    }
}

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Arrival {
    /// Open loop, exponential gaps with mean `1 / rate` seconds (a Poisson process, as vLLM's
    /// `bench serve --request-rate` with burstiness 1). `rate = ∞` sends everything at once.
    Poisson {
        /// Requests per second.
        #[serde(with = "rate_serde")]
        rate: f64,
    },
    /// Open loop, gamma-distributed gaps with mean `1 / rate` seconds and shape
    /// `burstiness` (vLLM's `bench serve --burstiness`: below 1 burstier than Poisson, above
    /// 1 more even; 1 is [`Arrival::Poisson`]). Gap ~ Gamma(k = burstiness, θ = 1 / (rate ·
    /// burstiness)).
    Gamma {
        /// Requests per second.
        #[serde(with = "rate_serde")]
        rate: f64,
        /// The gamma shape k (> 0).
        burstiness: f64,
    },
    /// Open loop, one request every `1 / rate` seconds.
    Constant {
        /// Requests per second.
        #[serde(with = "rate_serde")]
        rate: f64,
    },
    /// Closed loop: `clients` clients, each sending its next request when the last finished.
    Closed {
        /// Concurrent clients.
        clients: usize,
    },
}

impl Arrival {
    /// The x coordinate charts use: the rate in requests/s, or the client count.
    pub fn load(&self) -> f64 {
        match *self {
            Self::Poisson { rate } | Self::Constant { rate } | Self::Gamma { rate, .. } => rate,
            Self::Closed { clients } => clients as f64,
        }
    }

    /// A label: `poisson 2 req/s`, `gamma(0.5) 2 req/s`, `constant 2 req/s`, `closed 8
    /// clients`.
    pub fn label(&self) -> String {
        match *self {
            Self::Poisson { rate } => format!("poisson {rate} req/s"),
            Self::Gamma { rate, burstiness } => format!("gamma({burstiness}) {rate} req/s"),
            Self::Constant { rate } => format!("constant {rate} req/s"),
            Self::Closed { clients } => format!("closed {clients} clients"),
        }
    }

    /// Arrival times (seconds from the start) of `n` open-loop requests, seeded; `None` for a
    /// closed loop (arrivals follow completions).
    pub fn times(&self, n: usize, seed: u64) -> Option<Vec<f64>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xa11_1ce);
        match *self {
            Self::Poisson { rate } | Self::Constant { rate } | Self::Gamma { rate, .. }
                if rate.is_infinite() =>
            {
                Some(vec![0.0; n])
            }
            Self::Gamma { rate, burstiness } => {
                // Shape and scale were checked positive and finite where the load was built;
                // a bad pair here (a hand-edited meta.json) sends everything at once.
                let gap = rand_distr::Gamma::new(burstiness, 1.0 / (rate * burstiness)).ok()?;
                let mut t = 0.0;
                Some(
                    (0..n)
                        .map(|_| {
                            t += rand_distr::Distribution::sample(&gap, &mut rng);
                            t
                        })
                        .collect(),
                )
            }
            Self::Poisson { rate } => {
                let mut t = 0.0;
                Some(
                    (0..n)
                        .map(|_| {
                            // Inverse transform: −ln(1 − U) / λ, U ∈ [0, 1).
                            let u: f64 = rng.random();
                            t += -(1.0 - u).ln() / rate;
                            t
                        })
                        .collect(),
                )
            }
            Self::Constant { rate } => Some((0..n).map(|i| i as f64 / rate).collect()),
            Self::Closed { .. } => None,
        }
    }
}

/// A rate or load as JSON: a number, or `"inf"` for ∞ (JSON has no infinity; `serde_json`
/// would write `null`, read back as NaN). Reads numbers, `"inf"` and `null` (NaN: folders
/// written before this form).
pub mod load_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `r`, `"inf"` for +∞.
    pub fn serialize<S: Serializer>(r: &f64, s: S) -> Result<S::Ok, S::Error> {
        super::rate_serde::serialize(r, s)
    }

    /// Reads a number, `"inf"`, or `null` (NaN).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match NumOrText::deserialize(d)? {
            NumOrText::N(x) => Ok(x),
            NumOrText::S(s) if s.trim().eq_ignore_ascii_case("inf") => Ok(f64::INFINITY),
            NumOrText::S(s) => s.trim().parse().map_err(serde::de::Error::custom),
            NumOrText::Null(()) => Ok(f64::NAN),
        }
    }

    /// A rate as JSON may hold it.
    #[derive(Deserialize)]
    #[serde(untagged)]
    pub(super) enum NumOrText {
        N(f64),
        S(String),
        Null(()),
    }
}

impl std::fmt::Display for Arrival {
    /// The [`Arrival::label`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

/// Rates in JSON: a number, or the string `inf` (JSON has no infinity).
mod rate_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(r: &f64, s: S) -> Result<S::Ok, S::Error> {
        if r.is_finite() {
            s.serialize_f64(*r)
        } else {
            s.serialize_str("inf")
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        use super::load_serde::NumOrText;
        match NumOrText::deserialize(d)? {
            NumOrText::N(x) => Ok(x),
            NumOrText::S(s) => super::parse_rate(&s).map_err(serde::de::Error::custom),
            NumOrText::Null(()) => Err(serde::de::Error::custom("a rate cannot be null")),
        }
    }
}

/// JSON writes NaN as `null`: read it back as NaN.
pub fn f64_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    use serde::Deserialize;
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Parses `--rate` values: `2`, `0.5`, `inf`. Errors: [`Error::InvalidArgument`] naming
/// `--rate` for anything not a positive number.
pub fn parse_rate(s: &str) -> Result<f64> {
    let t = s.trim();
    let r = if t.eq_ignore_ascii_case("inf") {
        f64::INFINITY
    } else {
        t.parse::<f64>().unwrap_or(f64::NAN)
    };
    if r > 0.0 {
        Ok(r)
    } else {
        Err(Error::InvalidArgument {
            name: "--rate".into(),
            reason: format!("`{s}` is not a rate in requests/s like 0.5, 2 or inf"),
        })
    }
}

/// An open-loop request rate, requests/s (`--rate`): a positive number, or `inf` (every request
/// at once). Written to JSON as a number, or `"inf"`; read from a number or a string (run
/// folders before 0.1.0's typed settings wrote `"2"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(pub f64);

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_infinite() {
            f.write_str("inf")
        } else {
            write!(f, "{}", self.0)
        }
    }
}

impl FromStr for Rate {
    type Err = Error;
    /// Errors: as [`parse_rate`].
    fn from_str(s: &str) -> Result<Self> {
        parse_rate(s).map(Rate)
    }
}

impl serde::Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        rate_serde::serialize(&self.0, s)
    }
}

impl<'de> serde::Deserialize<'de> for Rate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let r = rate_serde::deserialize(d)?;
        if r > 0.0 {
            Ok(Rate(r))
        } else {
            Err(serde::de::Error::custom(format!(
                "`{r}` is not a rate in requests/s like 0.5, 2 or inf"
            )))
        }
    }
}

/// A point's load in a results row: the request rate (req/s; `inf`: every request at once) or
/// the closed-loop client count. In JSON and CSV a number, or `inf`; read from a number, `inf`,
/// or `null` (NaN: rows written before this form).
#[derive(Debug, Clone, Copy, Default, PartialEq, PartialOrd)]
pub struct Load(pub f64);

impl serde::Serialize for Load {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        load_serde::serialize(&self.0, s)
    }
}

impl<'de> serde::Deserialize<'de> for Load {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        load_serde::deserialize(d).map(Load)
    }
}

/// How open-loop requests are spaced (`--arrival`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ArrivalProcess {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Evenly spaced.
    Constant,
}

impl ArrivalProcess {
    /// The [`Arrival`] of this process at `rate` with `burstiness` (1: Poisson; otherwise
    /// gamma gaps, for `poisson` only — the caller refuses it with `constant`).
    pub fn at(self, rate: Rate, burstiness: f64) -> Arrival {
        match self {
            Self::Poisson if burstiness != 1.0 => Arrival::Gamma {
                rate: rate.0,
                burstiness,
            },
            Self::Poisson => Arrival::Poisson { rate: rate.0 },
            Self::Constant => Arrival::Constant { rate: rate.0 },
        }
    }
}

/// One request: its prompt (shared prefix excluded) and how many tokens to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Index in the run (0-based).
    pub id: usize,
    /// Prompt tokens after the shared prefix.
    pub prompt: Vec<u32>,
    /// Tokens to generate (end-of-sequence ignored, as `bench serve --ignore-eos`).
    pub output_len: usize,
}

/// `n` requests: lengths drawn from `input`/`output`, prompts cut at seeded offsets from
/// `text` (tokens; the first `skip` tokens are kept for the shared prefix). `trace_in`,
/// `trace_out`: the XSum pairs' lengths (used by [`LenDist::Xsum`]). Errors:
/// [`Error::InvalidArgument`] naming `--input-len` when `text` is shorter than a prompt.
pub fn requests(
    n: usize,
    input: &LenDist,
    output: &LenDist,
    text: &[u32],
    skip: usize,
    traces: (&[usize], &[usize]),
    seed: u64,
) -> Result<Vec<Request>> {
    let pool = text.get(skip..).unwrap_or(&[]);
    if pool.len() < input.max() {
        return Err(Error::InvalidArgument {
            name: "--input-len".into(),
            reason: format!(
                "prompts of up to {} tokens do not fit in the {} tokens of text after the \
                 shared prefix; use shorter prompts",
                input.max(),
                pool.len()
            ),
        });
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    Ok((0..n)
        .map(|id| {
            let pair = rng.random_range(0..traces.0.len().max(1));
            let len = input.draw(&mut rng, traces.0, pair);
            let out = output.draw(&mut rng, traces.1, pair);
            let at = rng.random_range(0..=pool.len() - len);
            Request {
                id,
                prompt: pool[at..at + len].to_vec(),
                output_len: out,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_parse_and_print() {
        assert_eq!("256".parse::<LenDist>().unwrap(), LenDist::Fixed(256));
        assert_eq!(
            "128..512".parse::<LenDist>().unwrap(),
            LenDist::Uniform(128, 512)
        );
        assert_eq!(
            "xsum:32..512".parse::<LenDist>().unwrap(),
            LenDist::Xsum(32, 512)
        );
        for bad in ["0", "512..128", "x", "1..", "xsum:0..3"] {
            assert!(bad.parse::<LenDist>().is_err(), "{bad}");
        }
        assert_eq!(LenDist::Uniform(3, 9).to_string(), "3..9");
        assert_eq!(LenDist::Uniform(128, 512).mean(&[]), 320.0);
        assert!(parse_rate("0").is_err() && parse_rate("-1").is_err());
        assert!(parse_rate("inf").unwrap().is_infinite());
        let a = Arrival::Poisson {
            rate: f64::INFINITY,
        };
        let j = serde_json::to_string(&a).unwrap();
        assert_eq!(j, r#"{"kind":"poisson","rate":"inf"}"#);
        assert_eq!(serde_json::from_str::<Arrival>(&j).unwrap(), a);
    }

    /// Constant rate 4 req/s: arrivals at 0, 0.25, 0.5, …
    #[test]
    fn constant_arrivals_by_hand() {
        let t = Arrival::Constant { rate: 4.0 }.times(5, 1).unwrap();
        assert_eq!(t, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(Arrival::Closed { clients: 3 }.times(5, 1), None);
    }

    /// Gamma gaps at 2 req/s with burstiness 0.25 (vLLM's `--burstiness`): mean gap 1/λ =
    /// 0.5 s whatever the shape, variance k·θ² = 0.25 · (1/(2 · 0.25))² = 1 s² (coefficient of
    /// variation 1/√k = 2, twice a Poisson process's), checked on 40,000 gaps.
    #[test]
    fn gamma_gaps_have_the_burstiness_variance() {
        let t = Arrival::Gamma {
            rate: 2.0,
            burstiness: 0.25,
        }
        .times(40_000, 3)
        .unwrap();
        let gaps: Vec<f64> = std::iter::once(t[0])
            .chain(t.windows(2).map(|w| w[1] - w[0]))
            .collect();
        let n = gaps.len() as f64;
        let mean = gaps.iter().sum::<f64>() / n;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / (n - 1.0);
        assert!((mean - 0.5).abs() < 0.02, "mean gap {mean}");
        assert!((var - 1.0).abs() < 0.1, "gap variance {var}");
        assert_eq!(
            ArrivalProcess::Poisson.at(Rate(2.0), 1.0),
            Arrival::Poisson { rate: 2.0 }
        );
    }

    /// A Poisson process at λ = 2 req/s: gaps are exponential with mean 1/λ = 0.5 s and
    /// standard deviation 0.5 s; over 20,000 gaps the sample mean is within 4 standard errors
    /// (4 · 0.5/√20000 ≈ 0.014 s) of 0.5, and the share of gaps over 1 s is e^(−2) ≈ 0.1353
    /// (± 4 · √(p(1−p)/n) ≈ 0.0097).
    #[test]
    fn poisson_gaps_are_exponential() {
        let t = Arrival::Poisson { rate: 2.0 }.times(20_000, 7).unwrap();
        let gaps: Vec<f64> = std::iter::once(t[0])
            .chain(t.windows(2).map(|w| w[1] - w[0]))
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((mean - 0.5).abs() < 0.014, "{mean}");
        let over = gaps.iter().filter(|&&g| g > 1.0).count() as f64 / gaps.len() as f64;
        assert!((over - (-2f64).exp()).abs() < 0.0097, "{over}");
    }

    /// Prompts are windows of the text after the prefix, with the drawn lengths; the same seed
    /// gives the same requests.
    #[test]
    fn requests_cut_from_text() {
        let text: Vec<u32> = (0..1000).collect();
        let r = requests(
            50,
            &LenDist::Uniform(10, 20),
            &LenDist::Fixed(4),
            &text,
            100,
            (&[], &[]),
            3,
        )
        .unwrap();
        for q in &r {
            assert!((10..=20).contains(&q.prompt.len()));
            assert!(q.prompt[0] >= 100);
            assert!(q.prompt.windows(2).all(|w| w[1] == w[0] + 1));
            assert_eq!(q.output_len, 4);
        }
        let again = requests(
            50,
            &LenDist::Uniform(10, 20),
            &LenDist::Fixed(4),
            &text,
            100,
            (&[], &[]),
            3,
        )
        .unwrap();
        assert_eq!(r, again);
        let trace = requests(
            3,
            &LenDist::Xsum(5, 8),
            &LenDist::Xsum(1, 100),
            &text,
            0,
            (&[3, 50, 7], &[9, 9, 9]),
            3,
        )
        .unwrap();
        for q in &trace {
            assert!([5, 8, 7].contains(&q.prompt.len()));
            assert_eq!(q.output_len, 9);
        }
        assert!(requests(
            1,
            &LenDist::Fixed(950),
            &LenDist::Fixed(1),
            &text,
            100,
            (&[], &[]),
            0
        )
        .is_err());
    }
}
