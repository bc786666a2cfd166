// stream-read.c — an independent check of `kvbench attn-bench --peak-bandwidth auto`: a
// STREAM-like (McCalpin 1995) read-only sum in C with OpenMP and AVX2 loads, static schedule,
// best and median of PASSES timed passes after one untimed one over MiB mebibytes.
//   gcc -O3 -march=native -fopenmp scripts/stream-read.c -o /tmp/stream-read
//   /tmp/stream-read [MiB=512] [PASSES=10]      (OMP_NUM_THREADS=N to set the threads)
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <omp.h>
#include <immintrin.h>
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  size_t bytes = (argc>1? strtoull(argv[1],0,10):512ull)<<20; int passes = argc>2?atoi(argv[2]):10;
  if (passes < 1) passes = 1; if (passes > 64) passes = 64;
  size_t n = bytes/8; uint64_t *b = aligned_alloc(64, n*8);
  #pragma omp parallel for schedule(static)
  for(size_t i=0;i<n;i++) b[i]=i;
  double r[64]; uint64_t sink=0;
  for(int p=0;p<=passes;p++){
    double t=omp_get_wtime(); uint64_t tot=0;
    #pragma omp parallel for schedule(static) reduction(+:tot)
    for(size_t c=0;c<n/32;c++){
      const __m256i *v=(const __m256i*)(b+c*32);
      __m256i a0=_mm256_load_si256(v),a1=_mm256_load_si256(v+1),a2=_mm256_load_si256(v+2),a3=_mm256_load_si256(v+3);
      a0=_mm256_add_epi64(a0,_mm256_load_si256(v+4));a1=_mm256_add_epi64(a1,_mm256_load_si256(v+5));
      a2=_mm256_add_epi64(a2,_mm256_load_si256(v+6));a3=_mm256_add_epi64(a3,_mm256_load_si256(v+7));
      a0=_mm256_add_epi64(_mm256_add_epi64(a0,a1),_mm256_add_epi64(a2,a3));
      tot+=_mm256_extract_epi64(a0,0)+_mm256_extract_epi64(a0,1)+_mm256_extract_epi64(a0,2)+_mm256_extract_epi64(a0,3);
    }
    t=omp_get_wtime()-t; sink+=tot; if(p>0) r[p-1]=bytes/t/1e9;
  }
  qsort(r,passes,sizeof(double),cmp);
  printf("stream-read: %zu MiB, %d threads, best %.2f GB/s, median %.2f GB/s (sink %llu)\n",bytes>>20,omp_get_max_threads(),r[passes-1],r[passes/2],(unsigned long long)(sink&1));
}
