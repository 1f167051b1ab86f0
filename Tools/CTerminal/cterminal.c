#define NCURSES_WIDECHAR 1
#define _XOPEN_SOURCE 700
#define _DEFAULT_SOURCE
#include "cterminal.h"

#include <curses.h>
#include <term.h>
#include <langinfo.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>
#include <wchar.h>

/* Codes past ncurses' own for the bracketed-paste brackets (define_key). */
#define PASTE_BEGIN_CODE (KEY_MAX + 1)
#define PASTE_END_CODE (KEY_MAX + 2)
#define WORD_LEFT_CODE (KEY_MAX + 3)
#define WORD_RIGHT_CODE (KEY_MAX + 4)

static SCREEN *screen;
/* The terminal as the shell left it, and the bytes that take the screen's modes back: written
 * by a signal handler, so made before any signal can come (write and tcsetattr are
 * async-signal-safe; curses is not). */
static struct termios shell_settings;
static int have_shell_settings;
static char restore_bytes[512];
static size_t restore_length;
static volatile sig_atomic_t active;
static const int restoring_signals[] = {SIGTERM, SIGHUP, SIGQUIT, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP};
static int atexit_installed;

static void choose_locale(void) {
    static int chosen;
    if (chosen) return;
    chosen = 1;
    /* Only the character type: numbers and dates stay as the tool formats them. */
    setlocale(LC_CTYPE, "");
    const char *codeset = nl_langinfo(CODESET);
    if (!codeset || strcmp(codeset, "UTF-8") != 0) setlocale(LC_CTYPE, "C.UTF-8");
}

static void append_restore(const char *bytes) {
    if (!bytes || bytes == (char *)-1) return;
    size_t length = strlen(bytes);
    if (restore_length + length >= sizeof restore_bytes) return;
    memcpy(restore_bytes + restore_length, bytes, length);
    restore_length += length;
}

/* Async-signal-safe: the screen's modes off, the alternate screen left, the settings back. */
static void restore_now(void) {
    if (!active) return;
    active = 0;
    ssize_t ignored = write(STDOUT_FILENO, restore_bytes, restore_length);
    (void)ignored;
    if (have_shell_settings) tcsetattr(STDIN_FILENO, TCSADRAIN, &shell_settings);
}

static void restore_and_die(int number) {
    restore_now();
    /* SA_RESETHAND made the default action current: the signal ends the process as it would
     * have (a core for a crash, the status a shell expects for SIGTERM). */
    raise(number);
}

static void restore_at_exit(void) { restore_now(); }

int ck_terminal_start(void) {
    if (screen) return 0;
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) return -1;
    choose_locale();
    have_shell_settings = tcgetattr(STDIN_FILENO, &shell_settings) == 0;
    screen = newterm(NULL, stdout, stdin);
    if (!screen) return -1;
    set_term(screen);
    raw();
    noecho();
    nonl();
    keypad(stdscr, TRUE);
    set_escdelay(25);
    mousemask(BUTTON4_PRESSED | BUTTON5_PRESSED, NULL);
    mouseinterval(0);
    define_key("\033[200~", PASTE_BEGIN_CODE);
    define_key("\033[201~", PASTE_END_CODE);
    define_key("\033[1;5D", WORD_LEFT_CODE);
    define_key("\033[1;5C", WORD_RIGHT_CODE);
    define_key("\033b", WORD_LEFT_CODE);
    define_key("\033f", WORD_RIGHT_CODE);

    restore_length = 0;
    append_restore("\033[?2004l\033[?1000l\033[?1002l\033[?1003l\033[?1006l");
    append_restore(tigetstr("sgr0"));
    append_restore(tigetstr("cnorm"));
    append_restore(tigetstr("rmkx"));
    append_restore(tigetstr("rmcup"));
    active = 1;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = restore_and_die;
    action.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < sizeof restoring_signals / sizeof restoring_signals[0]; i++) sigaction(restoring_signals[i], &action, NULL);
    if (!atexit_installed) {
        atexit(restore_at_exit);
        atexit_installed = 1;
    }
    /* Bracketed paste: a pasted block arrives between two brackets, newlines and all. */
    fputs("\033[?2004h", stdout);
    fflush(stdout);
    return 0;
}

void ck_terminal_stop(void) {
    if (!screen) return;
    active = 0;
    for (size_t i = 0; i < sizeof restoring_signals / sizeof restoring_signals[0]; i++) signal(restoring_signals[i], SIG_DFL);
    mousemask(0, NULL);
    fputs("\033[?2004l", stdout);
    fflush(stdout);
    endwin();
    delscreen(screen);
    screen = NULL;
    if (have_shell_settings) tcsetattr(STDIN_FILENO, TCSADRAIN, &shell_settings);
}

void ck_terminal_size(int *rows, int *width) {
    if (!screen) {
        *rows = 24;
        *width = 80;
        return;
    }
    getmaxyx(stdscr, *rows, *width);
}

void ck_terminal_erase(void) {
    if (screen) erase();
}

void ck_terminal_put(int row, int at, const char *text, int attributes) {
    if (!screen) return;
    attr_t attrs = A_NORMAL;
    if (attributes & CK_BOLD) attrs |= A_BOLD;
    if (attributes & CK_DIM) attrs |= A_DIM;
    if (attributes & CK_ITALIC) attrs |= A_ITALIC;
    if (attributes & CK_REVERSE) attrs |= A_REVERSE;
    if (attributes & CK_UNDERLINE) attrs |= A_UNDERLINE;
    attr_set(attrs, 0, NULL);
    mvaddstr(row, at, text);
    attr_set(A_NORMAL, 0, NULL);
}

void ck_terminal_cursor(int row, int at, int visible) {
    if (!screen) return;
    curs_set(visible ? 1 : 0);
    move(row, at);
}

void ck_terminal_repaint(void) {
    if (screen) clearok(curscr, TRUE);
}

void ck_terminal_show(void) {
    if (screen) refresh();
}

static int translate(int code) {
    switch (code) {
    case KEY_UP: return CK_KEY_UP;
    case KEY_DOWN: return CK_KEY_DOWN;
    case KEY_LEFT: return CK_KEY_LEFT;
    case KEY_RIGHT: return CK_KEY_RIGHT;
    case KEY_HOME: return CK_KEY_HOME;
    case KEY_END: return CK_KEY_END;
    case KEY_PPAGE: return CK_KEY_PAGE_UP;
    case KEY_NPAGE: return CK_KEY_PAGE_DOWN;
    case KEY_BACKSPACE: return CK_KEY_BACKSPACE;
    case KEY_DC: return CK_KEY_DELETE;
    case KEY_ENTER: return CK_KEY_ENTER;
    case KEY_BTAB: return CK_KEY_TAB_BACK;
    case KEY_RESIZE: return CK_KEY_RESIZE;
    case PASTE_BEGIN_CODE: return CK_KEY_PASTE_BEGIN;
    case PASTE_END_CODE: return CK_KEY_PASTE_END;
    case WORD_LEFT_CODE: return CK_KEY_WORD_LEFT;
    case WORD_RIGHT_CODE: return CK_KEY_WORD_RIGHT;
    default: return CK_KEY_OTHER;
    }
}

int ck_terminal_key(int timeout_ms, uint32_t *value) {
    if (!screen) return CK_READ_NONE;
    timeout(timeout_ms);
    wint_t key = 0;
    int kind = get_wch(&key);
    if (kind == OK) {
        *value = (uint32_t)key;
        return CK_READ_CHARACTER;
    }
    if (kind != KEY_CODE_YES) return CK_READ_NONE;
    if (key == KEY_MOUSE) {
        MEVENT event;
        if (getmouse(&event) != OK) return CK_READ_NONE;
        if (event.bstate & BUTTON4_PRESSED) *value = CK_KEY_WHEEL_UP;
        else if (event.bstate & BUTTON5_PRESSED) *value = CK_KEY_WHEEL_DOWN;
        else return CK_READ_NONE;
        return CK_READ_KEY;
    }
    *value = (uint32_t)translate((int)key);
    return CK_READ_KEY;
}

int ck_terminal_scalar_width(uint32_t scalar) {
    choose_locale();
    return wcwidth((wchar_t)scalar);
}
