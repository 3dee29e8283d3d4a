# Sourced: unpacks the CUDA-aware Open MPI carried as BIN_DIR/openmpi-cuda.tar.xz into /tmp/ompi-cuda
# (once) and puts it first (mpirun, libmpi), as tools/build_cuda_openmpi.sh prints.
_b=${1:?bin dir}
if [ ! -x /tmp/ompi-cuda/bin/mpirun ]; then
  mkdir -p /tmp/ompi-cuda && tar -xf "$_b/openmpi-cuda.tar.xz" -C /tmp/ompi-cuda --strip-components=1
fi
export OPAL_PREFIX=/tmp/ompi-cuda PATH=/tmp/ompi-cuda/bin:$PATH LD_LIBRARY_PATH=/tmp/ompi-cuda/lib:${LD_LIBRARY_PATH:-}
echo "# CUDA-aware Open MPI: $(command -v mpirun) ($(mpirun --version 2>&1 | head -1))"
