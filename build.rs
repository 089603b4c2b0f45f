//! Compiles src/comm/mpi_shim.c (MPI_IN_PLACE, a C macro) against the MPI library that the
//! `mpi` crate links, found the same way (mpicc, then pkg-config).

fn main() {
    println!("cargo:rerun-if-changed=src/comm/mpi_shim.c");
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errs) => {
            let why: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
            panic!("no MPI library found ({}); run scripts/setup.sh to install Open MPI", why.join("; "));
        }
    };
    let mut build = cc::Build::new();
    build.file("src/comm/mpi_shim.c");
    match lib.mpicc {
        Some(mpicc) => {
            build.compiler(mpicc);
        }
        None => {
            for dir in &lib.include_paths {
                build.include(dir);
            }
        }
    }
    build.compile("ringrec_mpi_shim");
}
