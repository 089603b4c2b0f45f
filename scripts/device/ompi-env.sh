# Sourced on the device machine: Open MPI 4.1.4 (Debian bookworm's) from .gpu/root, relocated.
R=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/root
export OPAL_PREFIX=$R/usr PMIX_INSTALL_PREFIX=$R/usr/lib/x86_64-linux-gnu/pmix2
export PATH=$R/usr/bin:$PATH
export LD_LIBRARY_PATH=$R/usr/lib/x86_64-linux-gnu/openmpi/lib:$R/usr/lib/x86_64-linux-gnu/pmix2/lib:$R/usr/lib/x86_64-linux-gnu:$R/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export PMIX_MCA_mca_base_component_path=$R/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix PMIX_MCA_pinstalldirs=env
export PMIX_MCA_pcompress_base_silence_warning=1
