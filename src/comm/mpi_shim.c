/* MPI_IN_PLACE as this MPI library defines it (Open MPI: (void *)1, MPICH: (void *)-1):
 * a macro, so Rust can only learn its value from C. Compiled by build.rs. */
#include <mpi.h>

void *ringrec_mpi_in_place(void) { return MPI_IN_PLACE; }
