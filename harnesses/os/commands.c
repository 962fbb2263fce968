/* bash, glob, grep: commands and searches under the declared root (berm.exec.run, berm.fs.glob/grep). */
#include "os.h"

/* A search's text, or a line saying that nothing matched (an empty result tells a model nothing). */
static berm_result_t search_result(berm_reply *found) {
    if (!found->error && found->len == 0) return berm_ok_str("no matches");
    return berm_reply_result(found, OS_REPLY_LIMIT);
}

BERM_TOOL(bash) {
    static const char *const known[] = {"command", "cwd", "env", NULL};
    berm_arg_set a = berm_args_object(known);
    berm_str command = {0}, cwd = BERM_STR("");
    berm_pair *env = NULL;
    size_t env_count = 0;
    os_arg_nonempty(&a, "command", &command);
    berm_arg_string(&a, "cwd", false, &cwd);
    berm_arg_string_map(&a, "env", false, &env, &env_count);
    if (a.error) return berm_fail(a.error);
    berm_reply ran = berm_exec_run(command, cwd, env, env_count);
    return berm_reply_result(&ran, OS_REPLY_LIMIT);
}

BERM_TOOL(glob) {
    static const char *const known[] = {"pattern", "path", NULL};
    berm_arg_set a = berm_args_object(known);
    berm_str pattern = {0}, path = BERM_STR("");
    os_arg_nonempty(&a, "pattern", &pattern);
    berm_arg_string(&a, "path", false, &path);
    if (a.error) return berm_fail(a.error);
    berm_reply found = berm_fs_glob(pattern, path);
    return search_result(&found);
}

BERM_TOOL(grep) {
    static const char *const known[] = {"pattern", "path", "include", "mode", NULL};
    static const char *const modes[] = {"files", "content", "count", NULL};
    berm_arg_set a = berm_args_object(known);
    berm_str pattern = {0}, path = BERM_STR(""), include = BERM_STR(""), mode = BERM_STR("files");
    os_arg_nonempty(&a, "pattern", &pattern);
    berm_arg_string(&a, "path", false, &path);
    berm_arg_string(&a, "include", false, &include);
    berm_arg_choice(&a, "mode", false, modes, &mode);
    if (a.error) return berm_fail(a.error);
    berm_reply found = berm_fs_grep(pattern, path, include, mode);
    return search_result(&found);
}
