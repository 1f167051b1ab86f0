/* The pre-update hook (Database.changeCount(watching:)): Debian's libsqlite3 is built with it;
   its declarations are only visible with this macro. */
#define SQLITE_ENABLE_PREUPDATE_HOOK 1
#include <sqlite3.h>

/* SQLITE_TRANSIENT is a macro that casts -1 to a function pointer; Swift cannot import it. */
static inline sqlite3_destructor_type csqlite_transient(void) { return SQLITE_TRANSIENT; }
