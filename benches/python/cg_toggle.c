/* Callgrind's collection toggle, for Python (ctypes): benches/python/batch_steps.py counts
 * the instructions of one step of a batch by collecting only between two toggles. Outside
 * valgrind the macro is a few no-op instructions. Build: gcc -O2 -shared -fPIC -o
 * cg_toggle.so cg_toggle.c (batch_steps.py does). */
#include <valgrind/callgrind.h>

void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
