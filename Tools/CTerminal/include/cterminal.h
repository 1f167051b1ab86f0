#ifndef CTERMINAL_H
#define CTERMINAL_H

#include <stdint.h>

/* The chat view's terminal, through ncursesw: the only code that speaks to curses. One thread
 * calls these (curses is not thread-safe). */

/* Keys other than characters, as ck_terminal_key reports them. */
enum {
    CK_KEY_UP = 1, CK_KEY_DOWN, CK_KEY_LEFT, CK_KEY_RIGHT, CK_KEY_HOME, CK_KEY_END,
    CK_KEY_PAGE_UP, CK_KEY_PAGE_DOWN, CK_KEY_BACKSPACE, CK_KEY_DELETE, CK_KEY_ENTER,
    CK_KEY_TAB_BACK, CK_KEY_RESIZE, CK_KEY_WHEEL_UP, CK_KEY_WHEEL_DOWN,
    CK_KEY_PASTE_BEGIN, CK_KEY_PASTE_END, CK_KEY_WORD_LEFT, CK_KEY_WORD_RIGHT, CK_KEY_OTHER
};

/* What ck_terminal_key read. */
enum { CK_READ_NONE = 0, CK_READ_CHARACTER = 1, CK_READ_KEY = 2 };

/* Text attributes for ck_terminal_put, combined with |. */
enum { CK_BOLD = 1, CK_DIM = 2, CK_ITALIC = 4, CK_REVERSE = 8, CK_UNDERLINE = 16 };

/* Takes the terminal: a UTF-8 character type (the environment's, or C.UTF-8), the alternate
 * screen, keys one at a time without echo or signals, the mouse wheel and bracketed paste.
 * From here until ck_terminal_stop, SIGTERM, SIGHUP, SIGQUIT and a crash (SIGSEGV, SIGBUS,
 * SIGILL, SIGFPE, SIGABRT, SIGTRAP), and exit(), put the terminal back as it was before the
 * process ends. Returns 0, or -1 when standard input and output are not a terminal terminfo
 * knows (nothing changed then). */
int ck_terminal_start(void);

/* Gives the terminal back as it was (the shell's screen, modes and settings). */
void ck_terminal_stop(void);

void ck_terminal_size(int *rows, int *width);

/* Clears the next frame. */
void ck_terminal_erase(void);

/* Writes UTF-8 text at a row and column of the next frame, with attributes. The caller keeps
 * the text to the screen's width (by display width) and free of control characters. */
void ck_terminal_put(int row, int column, const char *text, int attributes);

/* Where the cursor shows (visible or not) once the frame is on the screen. */
void ck_terminal_cursor(int row, int column, int visible);

/* The next frame is sent whole, as if the screen held nothing (Ctrl-L). */
void ck_terminal_repaint(void);

/* Puts the frame on the screen (only what changed is sent). */
void ck_terminal_show(void);

/* Waits up to timeout_ms for a key: CK_READ_CHARACTER with a Unicode scalar in *value, or
 * CK_READ_KEY with a CK_KEY_…, or CK_READ_NONE. */
int ck_terminal_key(int timeout_ms, uint32_t *value);

/* The columns a Unicode scalar takes (wcwidth, in the character type chosen at start): 0 for a
 * combining mark, 2 for a wide one, -1 for one not printable. */
int ck_terminal_scalar_width(uint32_t scalar);

#endif
