//! Hybrid attention's layer split: which decoder layers attend over a sliding window of recent
//! tokens and which attend globally (over every token), and so how many tokens each layer's
//! cache has to hold.
//!
//! - Mistral 7B v0.1 (Jiang et al. 2023, arXiv 2310.06825, §2): a window of 4096 tokens on
//!   every layer (`config.json` `sliding_window: 4096`).
//! - Gemma 2 (Gemma Team 2024, arXiv 2408.00118, §2.2): local and global layers alternate 1:1,
//!   window 4096; layer 0 is local (transformers `Gemma2DecoderLayer`:
//!   `is_sliding = not bool(layer_idx % 2)`).
//! - Gemma 3 (Gemma Team 2025, arXiv 2503.19786, §2.2 "5 local layers for every global layer,
//!   starting with a local layer"): window 1024 (512 for 270M and 1B); transformers
//!   `Gemma3DecoderLayer`: `is_sliding = bool((layer_idx + 1) % sliding_window_pattern)`, i.e.
//!   layer `i` (0-based) is global when `(i + 1) % 6 == 0`.
//! - gpt-oss: `layer_types` alternating `sliding_attention` / `full_attention`, window 128.
//!
//! A window layer attending at position `p` sees positions `p − window + 1 ..= p` (transformers'
//! sliding-window mask; vLLM's `SlidingWindowSpec`), so after `n` tokens it needs
//! `min(n, window)` of them; a global layer needs all `n`. Paged engines free whole blocks only
//! (vLLM `vllm/v1/core/single_type_kv_cache_manager.py`, `SlidingWindowManager.
//! remove_skipped_blocks`): see [`SlidingWindow::blocks_held`].

use crate::error::{Error, Result};

/// Which layers of a hybrid model attend globally; the others keep a sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GlobalLayers {
    /// Layer `i` (0-based) is global when `(i + 1) % period == 0`: Gemma 2 has period 2
    /// (layers 1, 3, 5, …), Gemma 3 period 6 (layers 5, 11, 17, …; transformers'
    /// `sliding_window_pattern`). Period 1 makes every layer global.
    Every(usize),
    /// No layer is global: every layer keeps the window (Mistral 7B v0.1).
    None,
    /// Bit `i` set: layer `i` is global (a `layer_types` list that follows no period; models of
    /// at most 128 layers).
    Mask(u128),
}

/// A sliding-window description: the window and which layers ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SlidingWindow {
    /// Tokens a window layer attends over and keeps, the current one included (transformers'
    /// and vLLM's `sliding_window`).
    pub window: usize,
    /// Which layers attend globally.
    pub global: GlobalLayers,
}

/// Tokens held per (sequence, kv head) on each layer type after some tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TokensHeld {
    /// On each window layer: `min(n, window)`.
    pub window: usize,
    /// On each global layer: `n`.
    pub global: usize,
}

impl SlidingWindow {
    /// Gemma 3's split: a window of `window` tokens, every `period`-th layer global.
    pub const fn every(window: usize, period: usize) -> Self {
        SlidingWindow {
            window,
            global: GlobalLayers::Every(period),
        }
    }

    /// Whether layer `i` (0-based) attends globally.
    pub fn is_global(&self, i: usize) -> bool {
        match self.global {
            GlobalLayers::Every(p) => p > 0 && (i + 1).is_multiple_of(p),
            GlobalLayers::None => false,
            GlobalLayers::Mask(m) => i < 128 && (m >> i) & 1 == 1,
        }
    }

    /// Global layers among `layers`: `⌊layers / period⌋` for [`GlobalLayers::Every`] (Gemma 3
    /// 27B: ⌊62 / 6⌋ = 10), 0 for [`GlobalLayers::None`], the set bits below `layers` for a mask.
    pub fn global_layers(&self, layers: usize) -> usize {
        match self.global {
            GlobalLayers::Every(p) if p > 0 => layers / p,
            GlobalLayers::Every(_) | GlobalLayers::None => 0,
            GlobalLayers::Mask(m) => (0..layers.min(128)).filter(|&i| (m >> i) & 1 == 1).count(),
        }
    }

    /// Blocks of `block` tokens a window layer's block table holds after `n` tokens, as vLLM's
    /// `SlidingWindowManager.remove_skipped_blocks` leaves it: the blocks before
    /// `⌊(n − window + 1) / block⌋` are freed, so `⌈n / block⌉ − max(0, ⌊(n − window + 1) /
    /// block⌋)` remain — at most `⌈window / block⌉ + 1` (the window straddles a block edge).
    /// Gemma 3 27B, window 1024, blocks of 16: after 131,072 tokens 8192 − 8128 = 64 blocks;
    /// after 131,073, 8193 − 8128 = 65. `block` 0 is taken as 1.
    pub fn blocks_held(&self, n: usize, block: usize) -> usize {
        let block = block.max(1);
        let freed = (n + 1).saturating_sub(self.window) / block;
        n.div_ceil(block) - freed
    }

    /// Checks the description against a model of `layers` layers. Errors:
    /// [`Error::InvalidArgument`] naming `sliding window` for a window of 0 tokens, a period of
    /// 0, or a mask naming a layer past the model.
    pub fn validate(&self, layers: usize) -> Result<()> {
        let bad = |reason: String| {
            Err(Error::InvalidArgument {
                name: "sliding window".into(),
                reason,
            })
        };
        if self.window == 0 {
            return bad("a window of 0 tokens holds nothing; give at least 1".into());
        }
        match self.global {
            GlobalLayers::Every(0) => bad("a global-layer period of 0: give 1 or more".into()),
            GlobalLayers::Mask(m) if layers < 128 && m >> layers != 0 => bad(format!(
                "the global-layer mask names a layer past the model's {layers}"
            )),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for SlidingWindow {
    /// `window 1024, every 6th layer global`, `window 4096 on every layer`, `window 128,
    /// global layers 1,3`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.global {
            GlobalLayers::Every(1) => write!(f, "window {} (every layer global)", self.window),
            GlobalLayers::Every(2) => write!(f, "window {}, every 2nd layer global", self.window),
            GlobalLayers::Every(p) => write!(f, "window {}, every {p}th layer global", self.window),
            GlobalLayers::None => write!(f, "window {} on every layer", self.window),
            GlobalLayers::Mask(m) => {
                let l: Vec<String> = (0..128)
                    .filter(|&i| (m >> i) & 1 == 1)
                    .map(|i| i.to_string())
                    .collect();
                write!(f, "window {}, global layers {}", self.window, l.join(","))
            }
        }
    }
}

/// The split a transformers `layer_types` list describes (`"sliding_attention"` /
/// `"full_attention"`, one per layer): [`GlobalLayers::None`] when no layer is full,
/// [`GlobalLayers::Every`] when the full layers are exactly every `p`-th, else a mask.
/// Errors: [`Error::InvalidArgument`] naming `layer_types` for another entry or more than 128
/// layers that follow no period.
pub fn global_layers_from_types(types: &[&str]) -> Result<GlobalLayers> {
    let bad = |reason: String| {
        Err(Error::InvalidArgument {
            name: "layer_types".into(),
            reason,
        })
    };
    let mut global = Vec::with_capacity(types.len());
    for t in types {
        match *t {
            "full_attention" => global.push(true),
            "sliding_attention" => global.push(false),
            other => {
                return bad(format!(
                    "`{other}`: kvbench knows sliding_attention and full_attention"
                ))
            }
        }
    }
    global_layers_from_flags(&global).ok_or_else(|| Error::InvalidArgument {
        name: "layer_types".into(),
        reason: format!(
            "{} layers whose full-attention layers follow no period: at most 128 supported",
            global.len()
        ),
    })
}

/// The split of a list of per-layer flags (`true`: the layer attends globally):
/// [`GlobalLayers::None`] when none is, [`GlobalLayers::Every`]`(p)` when exactly every `p`-th is
/// (`p` = the first global layer's index + 1), else a [`GlobalLayers::Mask`]; `None` for more
/// than 128 layers that follow no period.
fn global_layers_from_flags(global: &[bool]) -> Option<GlobalLayers> {
    if !global.contains(&true) {
        return Some(GlobalLayers::None);
    }
    let first = global.iter().position(|&g| g).unwrap_or(0) + 1;
    if global
        .iter()
        .enumerate()
        .all(|(i, &g)| g == (i + 1).is_multiple_of(first))
    {
        return Some(GlobalLayers::Every(first));
    }
    (global.len() <= 128).then(|| {
        GlobalLayers::Mask(
            global
                .iter()
                .enumerate()
                .filter(|(_, &g)| g)
                .fold(0u128, |m, (i, _)| m | 1 << i),
        )
    })
}

/// The description of a model's per-layer windows (`windows[i] = Some(w)`: layer `i` slides
/// over `w` tokens; `None`: global; layers past the list are global — the form of
/// `ModelConfig::layer_windows`, one entry per layer). `Ok(None)` when no layer slides.
///
/// Errors: [`Error::InvalidArgument`] naming `layer windows` for a window of 0 tokens, windows
/// of different sizes (one [`SlidingWindow`] has one size; no Gemma 2/3, Mistral or gpt-oss file
/// has more), or more than 128 layers whose global ones follow no period.
pub fn from_layer_windows(
    windows: &[Option<usize>],
    layers: usize,
) -> Result<Option<SlidingWindow>> {
    let bad = |reason: String| Error::InvalidArgument {
        name: "layer windows".into(),
        reason,
    };
    let mut sizes = windows.iter().flatten().copied();
    let Some(window) = sizes.next() else {
        return Ok(None);
    };
    if window == 0 || sizes.clone().any(|w| w == 0) {
        return Err(bad("a sliding window of 0 tokens".into()));
    }
    if let Some(other) = sizes.find(|&w| w != window) {
        return Err(bad(format!(
            "windows of {window} and {other} tokens on different layers: kvbench counts one \
             window size per model"
        )));
    }
    if windows.len() > layers {
        return Err(bad(format!(
            "{} windows for a model of {layers} layers",
            windows.len()
        )));
    }
    let global: Vec<bool> = (0..layers)
        .map(|i| windows.get(i).copied().flatten().is_none())
        .collect();
    let global = global_layers_from_flags(&global).ok_or_else(|| {
        bad(format!(
            "{layers} layers whose global ones follow no period: at most 128 supported"
        ))
    })?;
    Ok(Some(SlidingWindow { window, global }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3 27B (62 layers, pattern 6): global layers 5, 11, …, 59 — ten of them.
    #[test]
    fn gemma3_layers() {
        let w = SlidingWindow::every(1024, 6);
        let g: Vec<usize> = (0..62).filter(|&i| w.is_global(i)).collect();
        assert_eq!(g, [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]);
        assert_eq!(w.global_layers(62), 10);
        // Gemma 2: every odd layer (1, 3, …): 13 of Gemma-2-2B's 26.
        assert_eq!(SlidingWindow::every(4096, 2).global_layers(26), 13);
        let m = SlidingWindow {
            window: 4096,
            global: GlobalLayers::None,
        };
        assert_eq!(m.global_layers(32), 0);
    }

    /// vLLM's freeing rule by hand, window 4 and blocks of 2 (its `test_sliding_window` sizes):
    /// after 5 tokens ⌈5/2⌉ = 3 blocks minus ⌊2/2⌋ = 1 freed → 2; after 6: 3 − ⌊3/2⌋ = 2;
    /// after 7: 4 − 2 = 2; below the window nothing is freed.
    #[test]
    fn blocks_held_by_hand() {
        let w = SlidingWindow::every(4, 6);
        assert_eq!(
            (1..=8).map(|n| w.blocks_held(n, 2)).collect::<Vec<_>>(),
            [1, 1, 2, 2, 2, 2, 2, 2]
        );
        let g = SlidingWindow::every(1024, 6);
        assert_eq!(g.blocks_held(131_072, 16), 64);
        assert_eq!(g.blocks_held(131_073, 16), 65);
        assert_eq!(g.blocks_held(512, 16), 32);
    }

    #[test]
    fn layer_types_and_validation() {
        let gemma3: Vec<&str> = (0..12)
            .map(|i| {
                if (i + 1) % 6 == 0 {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();
        assert_eq!(
            global_layers_from_types(&gemma3).unwrap(),
            GlobalLayers::Every(6)
        );
        let oss = ["sliding_attention", "full_attention"].repeat(12);
        assert_eq!(
            global_layers_from_types(&oss).unwrap(),
            GlobalLayers::Every(2)
        );
        assert_eq!(
            global_layers_from_types(&["sliding_attention"; 4]).unwrap(),
            GlobalLayers::None
        );
        assert_eq!(
            global_layers_from_types(&["full_attention", "sliding_attention", "sliding_attention"])
                .unwrap(),
            GlobalLayers::Mask(1)
        );
        assert!(global_layers_from_types(&["chunked_attention"]).is_err());
        assert!(SlidingWindow::every(0, 6).validate(62).is_err());
        assert!(SlidingWindow::every(1024, 0).validate(62).is_err());
        let m = SlidingWindow {
            window: 8,
            global: GlobalLayers::Mask(1 << 40),
        };
        assert!(m.validate(32).is_err());
        assert!(m.validate(62).is_ok());
    }
}
