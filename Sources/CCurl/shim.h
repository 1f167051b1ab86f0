#include <curl/curl.h>
#include <sys/eventfd.h>  // a stream's wake-up (ServerStream.swift)

// curl_easy_setopt, curl_easy_getinfo and curl_multi_setopt are variadic: Swift calls these
// typed wrappers instead.
typedef size_t (*ck_data_callback)(char *data, size_t size, size_t count, void *user);

static inline CURLcode ck_setopt_long(CURL *handle, CURLoption option, long value) { return curl_easy_setopt(handle, option, value); }
static inline CURLcode ck_setopt_offset(CURL *handle, CURLoption option, curl_off_t value) { return curl_easy_setopt(handle, option, value); }
static inline CURLcode ck_setopt_pointer(CURL *handle, CURLoption option, void *value) { return curl_easy_setopt(handle, option, value); }
static inline CURLcode ck_setopt_string(CURL *handle, CURLoption option, const char *value) { return curl_easy_setopt(handle, option, value); }
static inline CURLcode ck_setopt_callback(CURL *handle, CURLoption option, ck_data_callback value) { return curl_easy_setopt(handle, option, value); }
static inline CURLcode ck_getinfo_long(CURL *handle, CURLINFO info, long *value) { return curl_easy_getinfo(handle, info, value); }
static inline CURLcode ck_getinfo_pointer(CURL *handle, CURLINFO info, void **value) { return curl_easy_getinfo(handle, info, value); }
static inline CURLcode ck_getinfo_socket(CURL *handle, CURLINFO info, curl_socket_t *value) { return curl_easy_getinfo(handle, info, value); }
static inline CURLMcode ck_multi_setopt_long(CURLM *multi, CURLMoption option, long value) { return curl_multi_setopt(multi, option, value); }
