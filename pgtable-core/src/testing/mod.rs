//! What tests and benchmarks use: the simulated machine, the conformance
//! suite, a readable test format and the code before the Linux changes.

#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub mod sim;
#[cfg(feature = "suite")]
#[cfg_attr(docsrs, doc(cfg(feature = "suite")))]
pub mod suite;
pub mod test_format;
pub mod variants;
