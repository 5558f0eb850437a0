resource_stack![
    Cuda::new(&ctx)?,
    Tlsf { initial: 2.8 GiB, max: 2.8 GiB },
]
