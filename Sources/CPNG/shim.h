#include <png.h>

/* libpng's simplified API describes formats and sizes with macros Swift cannot import. */
static const png_uint_32 ck_png_format_rgba = PNG_FORMAT_RGBA;
static const png_uint_32 ck_png_format_rgb = PNG_FORMAT_RGB;
static const png_uint_32 ck_png_format_gray = PNG_FORMAT_GRAY;
static const png_uint_32 ck_png_format_gray_alpha = PNG_FORMAT_GA;
static const png_uint_32 ck_png_format_linear_rgba = PNG_FORMAT_LINEAR_RGB_ALPHA;
static const png_uint_32 ck_png_format_linear_gray = PNG_FORMAT_LINEAR_Y;
static const png_uint_32 ck_png_format_rgba_colormap = PNG_FORMAT_RGBA_COLORMAP;
static const png_uint_32 ck_png_image_version = PNG_IMAGE_VERSION;
static const png_uint_32 ck_png_image_warning = PNG_IMAGE_WARNING;
static const png_uint_32 ck_png_image_flag_fast = PNG_IMAGE_FLAG_FAST;
