# cohort's CPU loops with flags of their own, for src/ and fuzz/ (which
# builds them with clang, instrumented): cohort_cpu_kernel_sources(OUT ROOT)
# sets each file's properties in the calling directory and puts the files
# (under ROOT, the src/ directory) in OUT.
#
# - train/fused_adamw.cc: -fno-math-errno lets the square roots of its loop
#   be vector instructions (a square root of a negative, which would set
#   errno, cannot occur there).
# - models/fused_kernels_{base,avx2,avx512}.cc: the fused ops' loops
#   (models/detail/fused_kernels_impl.h) once per instruction set, each
#   with ATen's CPU_CAPABILITY, which names the namespace of ATen's vector
#   types, so that no AVX-512 copy of a member function stands in for the
#   baseline's at link time; models/fused_kernels.cc calls the one ATen's
#   own dispatch chose. train/fused_adamw_avx2.cc and train/fused_sgd_avx2.cc
#   likewise for AdamW and SGD (train/fused_sgd.cc is SGD's baseline).
# - at::parallel_for is a header template: it runs on LibTorch's OpenMP
#   threads only where it is compiled with OpenMP, so with GCC the files
#   that call it get -fopenmp (clang would need LLVM's OpenMP runtime beside
#   LibTorch's libgomp: there they run on one thread).
# None is in a unity batch, whose other files would get the flags too, nor
# uses the precompiled header, built without them.
# ATen's vector headers include SLEEF's (libsleef-dev): callers link
# COHORT_SLEEF_LIBRARY, the libsleef.so.3 LibTorch itself links.
find_library(COHORT_SLEEF_LIBRARY NAMES sleef REQUIRED)

function(cohort_cpu_kernel_sources out root)
  set(openmp "")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    find_package(OpenMP REQUIRED COMPONENTS CXX)
    set(openmp "${OpenMP_CXX_FLAGS}")
  endif()
  set(files ${root}/train/fused_adamw.cc ${root}/train/fused_sgd.cc ${root}/models/fused_kernels_base.cc)
  set_source_files_properties(${root}/train/fused_sgd.cc PROPERTIES
    SKIP_UNITY_BUILD_INCLUDE ON SKIP_PRECOMPILE_HEADERS ON)
  set_source_files_properties(${root}/train/fused_adamw.cc PROPERTIES
    SKIP_UNITY_BUILD_INCLUDE ON SKIP_PRECOMPILE_HEADERS ON
    COMPILE_OPTIONS "${openmp};-fno-math-errno")
  set_source_files_properties(${root}/models/fused_kernels_base.cc PROPERTIES
    SKIP_UNITY_BUILD_INCLUDE ON SKIP_PRECOMPILE_HEADERS ON
    COMPILE_OPTIONS "${openmp}" COMPILE_DEFINITIONS "COHORT_KERNEL_ISA=base")
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64)$")
    set(avx2 "-mavx2;-mfma")
    set(avx512 "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mfma")
    list(APPEND files ${root}/train/fused_adamw_avx2.cc ${root}/train/fused_sgd_avx2.cc
         ${root}/models/fused_kernels_avx2.cc ${root}/models/fused_kernels_avx512.cc)
    set_source_files_properties(${root}/train/fused_sgd_avx2.cc PROPERTIES
      SKIP_UNITY_BUILD_INCLUDE ON SKIP_PRECOMPILE_HEADERS ON
      COMPILE_OPTIONS "${avx2}"
      COMPILE_DEFINITIONS "CPU_CAPABILITY=AVX2;CPU_CAPABILITY_AVX2")
    set_source_files_properties(${root}/train/fused_adamw_avx2.cc PROPERTIES
      SKIP_UNITY_BUILD_INCLUDE ON SKIP_PRECOMPILE_HEADERS ON
      COMPILE_OPTIONS "${avx2};-fno-math-errno"
      COMPILE_DEFINITIONS "CPU_CAPABILITY=AVX2;CPU_CAPABILITY_AVX2")
    set_source_files_properties(${root}/models/fused_kernels_avx2.cc PROPERTIES
      SKIP_UNITY_BUILD_INCLUDE ON SKIP_PRECOMPILE_HEADERS ON
      COMPILE_OPTIONS "${openmp};${avx2}"
      COMPILE_DEFINITIONS "COHORT_KERNEL_ISA=avx2;CPU_CAPABILITY=AVX2;CPU_CAPABILITY_AVX2")
    set_source_files_properties(${root}/models/fused_kernels_avx512.cc PROPERTIES
      SKIP_UNITY_BUILD_INCLUDE ON SKIP_PRECOMPILE_HEADERS ON
      COMPILE_OPTIONS "${openmp};${avx512}"
      COMPILE_DEFINITIONS "COHORT_KERNEL_ISA=avx512;CPU_CAPABILITY=AVX512;CPU_CAPABILITY_AVX512")
  endif()
  set(${out} ${files} PARENT_SCOPE)
endfunction()
