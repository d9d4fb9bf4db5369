/*
 * Starts a JVM for the APK's native libraries on an x86_64 Linux host (hydra_edge/android/host_runtime.py).
 *
 * Why not `java`: the JDK's launcher loads libjvm, and with it the host's libstdc++ and libgcc_s, into the
 * global symbol scope, where they interpose the NDK's C++ runtime (libc++_shared.so) that fbjni and
 * ExecuTorch were linked against; loading fbjni then crashes inside the unwinder. Here libjvm is opened
 * RTLD_LOCAL, so its C++ runtime stays private to it.
 *
 * usage: launcher LIBJVM CLASSPATH LIBRARY_PATH MAIN_CLASS [ARGS...]
 * exit: the Java main's (0, or 1 when it threw; System.exit is honoured), or the signal that ended the process.
 */
#include <dlfcn.h>
#include <jni.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef jint (*create_vm_t)(JavaVM **, void **, void *);

struct job {
    int argc;
    char **argv;
    int status;
};

static void *run_main(void *arg) {
    struct job *job = arg;
    job->status = 1;
    void *jvm = dlopen(job->argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!jvm) {
        fprintf(stderr, "cannot load %s: %s\n", job->argv[1], dlerror());
        return NULL;
    }
    create_vm_t create = (create_vm_t)dlsym(jvm, "JNI_CreateJavaVM");
    if (!create) {
        fprintf(stderr, "%s has no JNI_CreateJavaVM\n", job->argv[1]);
        return NULL;
    }
    size_t n = strlen(job->argv[2]) + sizeof "-Djava.class.path=";
    char *classpath = malloc(n);
    snprintf(classpath, n, "-Djava.class.path=%s", job->argv[2]);
    size_t m = strlen(job->argv[3]) + sizeof "-Djava.library.path=";
    char *library_path = malloc(m);
    snprintf(library_path, m, "-Djava.library.path=%s", job->argv[3]);
    /* -Xrs: the JVM leaves SIGABRT and SIGSEGV to the process, so a native abort ends it as on a phone */
    JavaVMOption options[] = {{classpath, NULL}, {library_path, NULL}, {"-Xrs", NULL}};
    JavaVMInitArgs init = {JNI_VERSION_1_8, 3, options, JNI_FALSE};
    JavaVM *vm;
    JNIEnv *env;
    if (create(&vm, (void **)&env, &init) != JNI_OK) {
        fprintf(stderr, "JNI_CreateJavaVM failed\n");
        return NULL;
    }
    jclass main_class = (*env)->FindClass(env, job->argv[4]);
    jmethodID main_method = main_class ? (*env)->GetStaticMethodID(env, main_class, "main", "([Ljava/lang/String;)V") : NULL;
    if (!main_method) {
        (*env)->ExceptionDescribe(env);
        return NULL;
    }
    jobjectArray args = (*env)->NewObjectArray(env, job->argc - 5, (*env)->FindClass(env, "java/lang/String"), NULL);
    for (int i = 5; i < job->argc; i++) {
        (*env)->SetObjectArrayElement(env, args, i - 5, (*env)->NewStringUTF(env, job->argv[i]));
    }
    (*env)->CallStaticVoidMethod(env, main_class, main_method, args);
    if ((*env)->ExceptionCheck(env)) {
        (*env)->ExceptionDescribe(env);
    } else {
        job->status = 0;
    }
    (*vm)->DetachCurrentThread(vm);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s LIBJVM CLASSPATH LIBRARY_PATH MAIN_CLASS [ARGS...]\n", argv[0]);
        return 2;
    }
    struct job job = {argc, argv, 1};
    /* the JVM's main thread needs a larger stack than a default pthread's on some hosts */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 16 << 20);
    pthread_t thread;
    if (pthread_create(&thread, &attr, run_main, &job) != 0) {
        fprintf(stderr, "cannot start the JVM's thread\n");
        return 1;
    }
    pthread_join(thread, NULL);
    fflush(stdout);
    fflush(stderr);
    _exit(job.status);  /* not DestroyJavaVM: the runtime's threads may still hold the VM */
}
