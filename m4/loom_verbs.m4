dnl loom_verbs.m4 - LOOM_CHECK_VERBS: the ibverbs transport (transports/ibverbs/),
dnl built when rdma-core's headers are found (--with-verbs[=DIR]); libibverbs
dnl itself is dlopen'ed at run time. Sets have_verbs, the HAVE_VERBS conditional
dnl and LOOM_HAVE_VERBS (the list in transports/transports.c reads it), and
dnl adds ibverbs to loom_transports (configure's summary).
AC_DEFUN([LOOM_CHECK_VERBS], [
AC_ARG_WITH([verbs],
  [AS_HELP_STRING([--with-verbs@<:@=DIR@:>@], [rdma-core headers (libibverbs is dlopen'ed at run time)])],
  [], [with_verbs=check])
have_verbs=no
AS_IF([test "x$with_verbs" != xno],
  [save_CPPFLAGS="$CPPFLAGS"
   AS_IF([test "x$with_verbs" != xyes && test "x$with_verbs" != xcheck], [CPPFLAGS="$CPPFLAGS -I$with_verbs/include"])
   AC_CHECK_HEADER([infiniband/verbs.h], [have_verbs=yes
     AC_DEFINE([LOOM_HAVE_VERBS], [1], [the ibverbs transport is built (libibverbs dlopen'ed)])])
   CPPFLAGS="$save_CPPFLAGS"
   AS_IF([test "x$have_verbs" = xno && test "x$with_verbs" != xcheck], [AC_MSG_ERROR([infiniband/verbs.h not found])])])
dnl dlopen is in libc from glibc 2.34; older systems need -ldl.
AS_IF([test "x$have_verbs" = xyes], [AC_SEARCH_LIBS([dlopen], [dl])])
AM_CONDITIONAL([HAVE_VERBS], [test "x$have_verbs" = xyes])
AS_IF([test "x$have_verbs" = xyes], [loom_transports="$loom_transports ibverbs"])
])
