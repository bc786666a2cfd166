//! Which candle device the decoder runs on: the `--device` flag's value.
//!
//! The same string is accepted on the command line, in a suite file and in `meta.json`
//! (`cpu`, `cuda:0`), so a recorded run names the device it ran on.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

use crate::error::{Error, Result};

/// The forms `--device` accepts, for error messages.
pub const VALID_DEVICES: &str = "cpu, cuda (= cuda:0), cuda:N (N = the GPU's ordinal, e.g. cuda:1)";

/// A device to run the model on, before it is opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// candle's CPU backend (the default).
    #[default]
    Cpu,
    /// An NVIDIA GPU through candle's CUDA backend, by ordinal (as `nvidia-smi` numbers them,
    /// subject to `CUDA_VISIBLE_DEVICES`).
    Cuda(usize),
}

impl DeviceSpec {
    /// Whether this is the CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self, DeviceSpec::Cpu)
    }

    /// Opens the device.
    ///
    /// Errors: [`Error::InvalidArgument`] (named `--device`) for `cuda:N` when kvbench was built
    /// without the `cuda` feature, saying to rebuild with `cargo build --release --features
    /// cuda`; [`Error::Device`] naming the device and candle's reason when the CUDA device cannot
    /// be opened (no such GPU, no driver, driver too old for the CUDA runtime).
    pub fn open(&self) -> Result<Device> {
        match *self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(n) => {
                // A runtime check rather than `#[cfg]`, so both branches are type-checked in
                // every build (without the feature candle's `new_cuda` is a stub that fails).
                if !cfg!(feature = "cuda") {
                    return Err(Error::InvalidArgument {
                        name: "--device".into(),
                        reason: format!(
                            "`{self}` needs a kvbench built with CUDA support; rebuild with \
                             `cargo build --release --features cuda` (needs the CUDA toolkit), \
                             or pass --device cpu"
                        ),
                    });
                }
                Device::new_cuda(n).map_err(|e| Error::Device {
                    device: self.to_string(),
                    reason: format!(
                        "{}; check that GPU {n} exists and the NVIDIA driver works \
                         (`nvidia-smi`), or pass --device cpu",
                        crate::error::first_line(&e)
                    ),
                })
            }
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = Error;

    /// Parses `cpu`, `cuda` or `cuda:N` (case-insensitive, surrounding spaces ignored).
    /// Errors: [`Error::InvalidArgument`] named `--device`, listing the accepted forms.
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        let bad = |why: String| Error::InvalidArgument {
            name: "--device".into(),
            reason: format!("{why}; accepted: {VALID_DEVICES}"),
        };
        match t.as_str() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => match t.strip_prefix("cuda:") {
                Some(n) => n
                    .parse::<usize>()
                    .map(DeviceSpec::Cuda)
                    .map_err(|_| bad(format!("`{s}`: `{n}` is not a GPU ordinal"))),
                None => Err(bad(format!("`{s}` is not a device"))),
            },
        }
    }
}

impl serde::Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        crate::util::serde_text::serialize(self, s)
    }
}

impl<'de> serde::Deserialize<'de> for DeviceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        crate::util::serde_text::deserialize(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms_round_trip() {
        for (text, want, shown) in [
            ("cpu", DeviceSpec::Cpu, "cpu"),
            ("CPU", DeviceSpec::Cpu, "cpu"),
            (" cpu ", DeviceSpec::Cpu, "cpu"),
            ("cuda", DeviceSpec::Cuda(0), "cuda:0"),
            ("cuda:0", DeviceSpec::Cuda(0), "cuda:0"),
            ("cuda:3", DeviceSpec::Cuda(3), "cuda:3"),
            ("CUDA:1", DeviceSpec::Cuda(1), "cuda:1"),
        ] {
            let d: DeviceSpec = text.parse().unwrap();
            assert_eq!(d, want, "{text}");
            assert_eq!(d.to_string(), shown);
            assert_eq!(
                shown.parse::<DeviceSpec>().unwrap(),
                d,
                "Display parses back"
            );
        }
        assert_eq!(DeviceSpec::default(), DeviceSpec::Cpu);
    }

    #[test]
    fn rejected_forms_list_the_accepted_ones() {
        for (text, names) in [
            ("gpu", "`gpu` is not a device"),
            ("cuda:x", "`x` is not a GPU ordinal"),
            ("cuda:", "is not a GPU ordinal"),
            ("cuda:-1", "`-1` is not a GPU ordinal"),
            ("cuda0", "`cuda0` is not a device"),
            ("", "is not a device"),
            ("metal", "`metal` is not a device"),
        ] {
            let e = text.parse::<DeviceSpec>().unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{text}: {e:?}");
            let msg = e.to_string();
            assert!(msg.contains("--device"), "{msg}");
            assert!(msg.contains(names), "{text}: {msg}");
            assert!(
                msg.contains("cpu") && msg.contains("cuda:N"),
                "lists the accepted forms: {msg}"
            );
        }
    }

    #[test]
    fn cpu_opens() {
        assert!(DeviceSpec::Cpu.open().unwrap().is_cpu());
    }

    /// Without the `cuda` feature, a CUDA device is a usage error with the rebuild command.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_rebuild() {
        let e = DeviceSpec::Cuda(0).open().unwrap_err();
        assert!(e.is_usage(), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("--device"), "{msg}");
        assert!(msg.contains("cuda:0"), "{msg}");
        assert!(
            msg.contains("cargo build --release --features cuda"),
            "{msg}"
        );
    }

    #[test]
    fn serde_uses_the_flag_string() {
        let v = serde_json::to_value(DeviceSpec::Cuda(2)).unwrap();
        assert_eq!(v, serde_json::json!("cuda:2"));
        let d: DeviceSpec = serde_json::from_value(serde_json::json!("cpu")).unwrap();
        assert_eq!(d, DeviceSpec::Cpu);
        assert!(serde_json::from_value::<DeviceSpec>(serde_json::json!("gpu")).is_err());
    }
}
