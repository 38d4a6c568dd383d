#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <pthread.h>
#include <time.h>
#include <sys/wait.h>
#include <sys/mman.h>
static int a[2], b[2]; static long N;
static void *peer(void *x){ char c; for(long i=0;i<N;i++){ if(read(a[0],&c,1)!=1) exit(1); if(write(b[1],&c,1)!=1) exit(1);} return 0; }
static double now(){ struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9; }
int main(int argc,char**argv){
  N=atol(argv[2]); int proc=argv[1][0]=='p';
  pipe(a); pipe(b);
  /* touch some memory so address-space switches have something to refill */
  size_t sz=64<<20; char *m=malloc(sz); for(size_t i=0;i<sz;i+=4096) m[i]=1;
  pthread_t t; pid_t pid=0;
  if(proc){ pid=fork(); if(pid==0){ peer(0); _exit(0);} } else pthread_create(&t,0,peer,0);
  char c='x'; double t0=now();
  for(long i=0;i<N;i++){ write(a[1],&c,1); read(b[0],&c,1); }
  double dt=now()-t0;
  if(proc) waitpid(pid,0,0); else pthread_join(t,0);
  printf("%s: %.2f us per round trip (2 switches)\n", proc?"processes":"threads", dt/N*1e6);
}
