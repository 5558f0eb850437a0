//! `resource_stack!`, the list syntax for mrstack resource stacks. Use it through `mrstack`.

mod expand;
mod parse;
mod size;

use proc_macro::TokenStream;

/// Builds a resource stack: the first item is the leaf, each following item wraps the one above.
///
/// ```ignore
/// let mr = resource_stack![
///     Cuda::new(&ctx)?,                     // the leaf: any expression of a resource type
///     Pool { initial: 1 GiB, max: 8 GiB },  // mrstack::suballoc::PoolConfig, other fields defaulted
///     Statistics,                           // mrstack::adaptor::StatisticsConfig::default()
/// ];
/// ```
///
/// # Grammar
///
/// ```text
/// resource_stack![ leaf (, layer)* ,? ]
/// leaf   = an expression whose type implements MemoryResource (a constructor that returns a
///          Result needs its `?`)
/// layer  = Name | Name<Args> | Name { field: value, … }   (the configuration NameConfig of mrstack's Name)
///        | any other expression of a type that implements Layer
/// ```
///
/// The leaf comes first: one of mrstack's configurations there is an error that says so.
/// Items are separated by commas, and so are fields; a missing one is an error that names it.
///
/// # Sizes
///
/// The fields that hold bytes (`Pool`'s `initial` and `max`, `Binning`'s `min` and `max`,
/// `Arena`'s `size` and `superblock`, `FixedSize`'s `block_size`, `Limiting`'s `limit`) take:
///
/// * **a number literal and its unit**, with or without a space: `512 MiB`, `1.5 GiB`, `64KiB`,
///   `4096 B`, `0x10 MiB`. Units and rounding follow the `mrstack-units` crate docs (`KB` = `KiB`
///   = 1024 bytes, decimals truncated to whole bytes); a bad unit or a size past 64 bits is a
///   compile error;
/// * **a string** in Holoscan's spelling: `"512MB"`, `"1.5 GiB"`, read the same way;
/// * **any other expression**, of type `usize`, taken as bytes: `1 << 30`, `n * 1024`,
///   `my_bytes`, `usize::MAX`;
/// * `0`, which is zero in any unit.
///
/// A number literal alone (`initial: 64`, `"64"`) is an error: write its unit, `64 B` for bytes.
/// A unit applies to one number literal, not to an expression or a variable (`n GiB`,
/// `64 * 1024 MiB` are errors that show the `usize` expression to write: `n << 30`), and sizes
/// with units are read only as field values, not inside expressions (`Simulated::new(1 GiB)` is
/// an error that shows the bytes). The fields that count (`FixedSize`'s `blocks_to_preallocate`,
/// `Prefetch`'s `device`) refuse a unit. `Pool`'s `initial` above its `max`, or `Binning`'s `min`
/// above its `max`, is a compile error when both are literal sizes.
///
/// Other fields take an expression of their type, as in a struct literal.
#[proc_macro]
pub fn resource_stack(input: TokenStream) -> TokenStream {
    match syn::parse::<parse::Stack>(input) {
        Ok(stack) => stack.expand().into(),
        Err(e) => e.to_compile_error().into(),
    }
}

#[cfg(test)]
mod tests;
