//! The guide: which stack to build, the rules the resources keep, the C library, what was
//! measured, and where each piece lives. Every chapter is a module of documentation only; its
//! examples are compiled and run as doctests (over [`Simulated`](crate::leaf::Simulated) or
//! [`System`](crate::leaf::System) where they need no GPU).
//!
//! * [`choosing`](crate::guide::choosing): which stack to start with; every leaf, suballocator and adaptor, and what each
//!   gives; a library function over any resource.
//! * [`replay`](crate::guide::replay): `mrstack replay`, which answers "which stack, and how much memory?" for a workload
//!   of your own; recording a log.
//! * [`streams`](crate::guide::streams): containers on several streams, views, staging, growing in place, several GPUs.
//! * [`soundness`](crate::guide::soundness): what every safe function keeps, and the holes still open.
//! * [`text_config`](crate::guide::text_config): stacks from text, describing a stack, reaching a layer, choosing at run time,
//!   size literals.
//! * [`c_library`](crate::guide::c_library): `libmrstack_c` for C, C++ and Python (PyTorch, CuPy, CV-CUDA, TensorRT).
//! * [`performance`](crate::guide::performance): the latest measured tables, and the commands that made them.
//! * [`architecture`](crate::guide::architecture): the map of folders and files, and the tests.

pub mod architecture;
pub mod c_library;
pub mod choosing;
pub mod performance;
pub mod replay;
pub mod soundness;
pub mod streams;
pub mod text_config;
